"""Valid SETs that fill a store: torch's own client SETs distinct keys with large values and never deletes them
(issue #25's store-memory flood), reconnecting whenever the guard closes its connection.

  valid_flood.py HOST PORT --count N --size BYTES --prefix P [--use-libuv 0|1] [--verify]

Prints one JSON line: {"attempted": N, "failed": F, "reconnects": R, "verified": V}; --verify GETs every key back
and counts those equal to what was SET (a job's own SETs, which must all pass). A SET has no reply, so a refused SET shows
as the failure of the next op: each SET is followed by a GETNUMKEYS, whose failure marks that SET refused.
"""
import argparse
import datetime
import json
import os

from torch.distributed import TCPStore


def connect(a):
    kw = {} if a.use_libuv is None else {"use_libuv": bool(a.use_libuv)}
    return TCPStore(a.host, a.port, 1, False, timeout=datetime.timedelta(seconds=20), **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--prefix", default="flood")
    ap.add_argument("--use-libuv", type=int, default=None)
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args()
    value = os.urandom(a.size)
    store, failed, reconnects = connect(a), 0, 0
    for i in range(a.count):
        try:
            store.set(f"{a.prefix}/{i}", value)
            store.num_keys()
        except Exception:  # the guard closed the connection: that SET was refused
            failed += 1
            reconnects += 1
            store = connect(a)
    verified = sum(store.get(f"{a.prefix}/{i}") == value for i in range(a.count)) if a.verify else 0
    print(json.dumps({"attempted": a.count, "failed": failed, "reconnects": reconnects, "verified": verified}), flush=True)


if __name__ == "__main__":
    main()
