#!/usr/bin/env python3
"""One torchrun worker (env://, gloo) that runs long enough for an attack to land while it runs.

Configured by environment (torchrun's parser would eat worker flags):
  PW_OUT        directory; each rank writes PW_OUT/started<R>-<attempt> once its process group is up,
                and PW_OUT/rank<R>.json when it is done
  PW_SECONDS    how long the all_reduce loop lasts (default 15); one all_reduce every 0.1 s
  PW_FAIL_ONCE  a global rank that exits 1 on the first attempt (TORCHELASTIC_RESTART_COUNT == 0), to make
                the agent restart the workers (--max-restarts). It exits before its process group is
                made, and the other ranks of that attempt wait to be stopped: from 2.6 the workers' store is
                the agent's, shared by every attempt with no attempt prefix, and gloo's rank_<r> addresses
                left by an attempt that got as far as init_process_group make the next attempt connect to
                dead ports (torch's own failure, seen without any proxy too)

Iteration i all_reduces [(rank + 1) * i]; the checksum is the sum of the results over the loop,
world_size * (world_size + 1) / 2 * n * (n - 1) / 2 for n iterations, which the rank writes with
its world size, so the test can check it against the world size it expects.
"""
import datetime
import json
import os
import sys
import time


def expected_checksum(world_size, iterations):
    return float(world_size * (world_size + 1) // 2 * iterations * (iterations - 1) // 2)


def main():
    out = os.environ["PW_OUT"]
    seconds = float(os.environ.get("PW_SECONDS", "15"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fail = os.environ.get("PW_FAIL_ONCE")
    if fail is not None and restart == 0:  # before importing torch: a failed attempt costs no torch start
        if int(fail) == int(os.environ["RANK"]):
            print(f"rank {fail}: failing on purpose on attempt {restart}", file=sys.stderr, flush=True)
            os._exit(1)
        time.sleep(60)  # the agent stops this attempt when it sees the failure
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(out, f"started{rank}-{restart}"), "w") as fh:
        fh.write(f"{world}\n")
    n = max(2, int(seconds * 10))
    total = 0.0
    for i in range(n):
        t = torch.tensor([float((rank + 1) * i)])
        dist.all_reduce(t)
        total += t.item()
        time.sleep(0.1)
    dist.barrier()
    res = {"rank": rank, "world_size": world, "iterations": n, "checksum": total,
           "expected": expected_checksum(world, n), "restart_count": restart,
           "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
           "torch": torch.__version__.split("+")[0]}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(res, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
