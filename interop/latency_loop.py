#!/usr/bin/env python3
"""A benign client for the attack tests: set/get in a loop against HOST:PORT for SECONDS and
print one JSON object with per-second latency medians and the error count.

  latency_loop.py HOST PORT SECONDS
"""
import datetime
import json
import statistics
import sys
import time

import torch.distributed as dist


def main():
    host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    try:
        s = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=30), wait_for_workers=False)
    except TypeError:
        s = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=30))
    start = time.monotonic()
    per_second, errors, ops, i = {}, 0, 0, 0
    print(json.dumps({"ready": True}), flush=True)
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        try:
            s.set(f"benign/{i % 16}", str(i))
            if s.get(f"benign/{i % 16}") != str(i).encode():
                errors += 1
        except Exception:  # noqa: BLE001 - any failure counts
            errors += 1
        dt = time.monotonic() - t0
        per_second.setdefault(int(t0 - start), []).append(dt)
        ops += 1
        i += 1
    medians = [statistics.median(per_second[k]) for k in sorted(per_second)]
    print(json.dumps({"ops": ops, "errors": errors, "p50_per_second": medians,
                      "max": max(max(v) for v in per_second.values())}), flush=True)


if __name__ == "__main__":
    main()
