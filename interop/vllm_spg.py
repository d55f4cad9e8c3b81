#!/usr/bin/env python3
"""vLLM's own StatelessProcessGroup (vllm/distributed/utils.py of a real release, scripts/vllm-src.sh) through a TCPStore.

  vllm_spg.py HOST PORT --serve-store SPORT [--world 3]

Hosts a TCPStore master on 127.0.0.1:SPORT (the store behind HOST:PORT), then runs WORLD ranks as threads, each
with a client TCPStore to HOST:PORT wrapped in vLLM's StatelessProcessGroup, and does what vLLM does with it:
broadcast_obj of a dict (config values, a tensor, torch.Size, a dtype, a datetime), a ring of send_obj/recv_obj
of PyNcclPipe-style metadata ({"dtype", "shape"}), all_gather_obj, broadcast and send/recv of tensors,
all_reduce, barrier, and PyNcclCommunicator's broadcast_obj of its ncclUniqueId (a ctypes structure of vLLM's
pynccl_wrapper). Every rank checks what it received. Prints one JSON line {"ok", "checks", "errors", "vllm",
"torch"}; exit 0 iff ok.
"""
import argparse
import datetime
import json
import os
import sys
import threading


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--serve-store", type=int, required=True)
    ap.add_argument("--world", type=int, default=3)
    a = ap.parse_args()
    import torch
    import torch.distributed as dist
    import vllm
    from vllm.distributed.device_communicators.pynccl_wrapper import ncclUniqueId
    from vllm.distributed.utils import StatelessProcessGroup

    td = datetime.timedelta(seconds=60)
    server = dist.TCPStore("127.0.0.1", a.serve_store, None, True, td, wait_for_workers=False)  # noqa: F841
    when = datetime.datetime(2026, 12, 2, 4, 30, tzinfo=datetime.timezone.utc)
    errors, checks, lock = [], [0], threading.Lock()

    def check(rank, what, ok):
        with lock:
            checks[0] += 1
            if not ok:
                errors.append(f"rank {rank}: {what}")

    def rank_main(rank):
        try:
            store = dist.TCPStore(a.host, a.port, None, False, td, wait_for_workers=False)
            g = StatelessProcessGroup(rank=rank, world_size=a.world, store=store)
            conf = {"model": "m", "tp": a.world, "tensor": torch.arange(8.0), "size": torch.Size([4, 16]),
                    "dtype": torch.bfloat16, "when": when}
            got = g.broadcast_obj(conf if rank == 0 else None, src=0)
            check(rank, "broadcast_obj", torch.equal(got["tensor"], conf["tensor"]) and got["size"] == conf["size"] and
                  got["dtype"] == conf["dtype"] and got["when"] == when)
            meta = {"dtype": torch.float16, "shape": torch.Size([2, rank + 1])}
            g.send_obj(meta, dst=(rank + 1) % a.world)
            prev = (rank - 1) % a.world
            got = g.recv_obj(src=prev)
            check(rank, "recv_obj", got == {"dtype": torch.float16, "shape": torch.Size([2, prev + 1])})
            got = g.all_gather_obj({"rank": rank, "host": f"node-{rank}"})
            check(rank, "all_gather_obj", got == [{"rank": r, "host": f"node-{r}"} for r in range(a.world)])
            t = g.broadcast(torch.full((3,), 7.0) if rank == 0 else torch.zeros(3), src=0)
            check(rank, "broadcast", torch.equal(t, torch.full((3,), 7.0)))
            g.send(torch.full((2,), float(rank)), dst=(rank + 1) % a.world)
            t = g.recv(torch.zeros(2), src=prev)
            check(rank, "send/recv", torch.equal(t, torch.full((2,), float(prev))))
            t = g.all_reduce(torch.ones(4) * (rank + 1))
            check(rank, "all_reduce", torch.equal(t, torch.ones(4) * sum(range(1, a.world + 1))))
            g.barrier()
            uid = ncclUniqueId()
            if rank == 0:
                for i in range(128):
                    uid.internal[i] = (i * 7) % 256 - 128
            uid = g.broadcast_obj(uid, src=0)  # PyNcclCommunicator.__init__
            check(rank, "ncclUniqueId", [uid.internal[i] for i in range(128)] == [(i * 7) % 256 - 128 for i in range(128)])
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"rank {rank}: {type(e).__name__}: {e}"[:400])

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(a.world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    ok = not errors and checks[0] == 7 * a.world
    print(json.dumps({"ok": ok, "checks": checks[0], "errors": errors, "vllm": vllm.__version__,
                      "torch": torch.__version__.split("+")[0]}), flush=True)
    sys.stdout.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
