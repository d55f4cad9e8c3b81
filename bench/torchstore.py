"""Start a real torch TCPStore server for bench/side-by-side.sh and hold it until killed.

usage: python torchstore.py PORT [legacy|libuv|default]

Prints "ready <torch version> <backend>" once the store listens. torch 1.13/2.0/2.1 have no
use_libuv argument (their store is the legacy one); "default" passes nothing.
"""
import datetime
import signal
import sys
import time

import torch
import torch.distributed as dist


def main():
    port = int(sys.argv[1])
    backend = sys.argv[2] if len(sys.argv) > 2 else "default"
    kw = {}
    if backend in ("legacy", "libuv"):
        kw["use_libuv"] = backend == "libuv"
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(hours=1),
                          wait_for_workers=False, **kw)
    used = getattr(store, "libuvBackend", None)
    print("ready", torch.__version__, backend if used is None else ("libuv" if used else "legacy"),
          flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
