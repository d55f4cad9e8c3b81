#!/usr/bin/env python3
"""A world_size-4 gloo job (barrier + all_reduce) whose rendezvous store is at HOST:PORT.

  pg_job.py HOST PORT [--rdzv store|agent|tcp|torchrun] [--serve-store SPORT] [--world-size 4]
                      [--use-libuv 0|1] [--timeout 60]

Launches world_size worker processes (itself with --rank R), waits for them and
prints one JSON line {"reduced": 10.0, "expected": 10.0, "rdzv": ..., "ranks": [...]};
exit 0 when every rank reduced the expected value.

Rendezvous modes (see interop/README.md for which of them can go through a proxy):
  store  every rank builds a client TCPStore(HOST, PORT, is_master=False) and calls
         init_process_group("gloo", store=..., rank, world_size). The store server
         must already run: --serve-store SPORT makes this launcher start a real
         TCPStore master on SPORT first (put a proxy PORT -> SPORT in between, or
         use PORT == SPORT for a direct run).
  agent  init_process_group("gloo", init_method="tcp://HOST:PORT", rank, world_size)
         with TORCHELASTIC_USE_AGENT_STORE=True, MASTER_ADDR=HOST, MASTER_PORT=PORT,
         TORCHELASTIC_RESTART_COUNT=0 (what torchrun exports): every rank, rank 0
         included, is a store client, so HOST:PORT may be a proxy. Needs a store
         server as for "store".
  tcp    plain init_method="tcp://HOST:PORT": rank 0 hosts the store itself,
         binding PORT on all interfaces, so nothing else can listen on PORT: a
         proxy cannot sit in front of it. Direct runs only.
  torchrun  python -m torch.distributed.run --nnodes 1 --nproc-per-node W
         --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-conf is_host=false,
         workers use env://. Only the agent's rendezvous connection uses HOST:PORT
         (needs a store server as for "store"); the workers' own store is a second
         TCPStore that the agent hosts on a free port of its own, which a proxy at
         HOST:PORT never sees.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

TD = datetime.timedelta


def worker(a):
    import torch
    import torch.distributed as dist
    kw = {}
    if a.rdzv == "store":
        skw = dict(wait_for_workers=False)
        if a.use_libuv is not None:
            skw["use_libuv"] = bool(a.use_libuv)
        try:
            store = dist.TCPStore(a.host, a.port, None, False, TD(seconds=a.timeout), **skw)
        except TypeError:
            skw.pop("use_libuv", None)
            store = dist.TCPStore(a.host, a.port, None, False, TD(seconds=a.timeout), **skw)
        kw["store"] = store
    else:
        q = "" if a.use_libuv is None else f"?use_libuv={a.use_libuv}"
        kw["init_method"] = f"tcp://{a.host}:{a.port}{q}"
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world_size, timeout=TD(seconds=a.timeout), **kw)
    dist.barrier()
    t = torch.tensor([float(a.rank + 1)])
    dist.all_reduce(t)
    dist.barrier()
    print(json.dumps({"rank": a.rank, "reduced": t.item(), "torch": torch.__version__.split("+")[0]}), flush=True)
    dist.destroy_process_group()


def env_worker(a):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=TD(seconds=a.timeout))
    rank = dist.get_rank()
    dist.barrier()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.barrier()
    res = {"rank": rank, "reduced": t.item(), "torch": torch.__version__.split("+")[0],
           "worker_store": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"}
    # one file per rank: the workers share torchrun's stdout, where lines can interleave
    with open(os.path.join(os.environ["PG_JOB_OUT"], f"rank{rank}.json"), "w") as fh:
        json.dump(res, fh)
    dist.destroy_process_group()


def launch_torchrun(a):
    server = serve_store(a) if a.serve_store else None  # noqa: F841 (kept alive)
    env = dict(os.environ)
    if a.host.startswith("127.") or a.host == "localhost":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(a.world_size), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", f"{a.host}:{a.port}", "--rdzv_conf", "is_host=false",
           os.path.abspath(__file__)]  # worker args go by env: torchrun's parser would eat "--rdzv ..."
    import tempfile
    outdir = tempfile.mkdtemp(prefix="pg_job-")
    env.update(PG_JOB_ROLE="env-worker", PG_JOB_TIMEOUT=str(a.timeout), PG_JOB_OUT=outdir)
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=a.timeout + 60)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout", -1
    ranks = []
    for r in range(a.world_size):
        try:
            with open(os.path.join(outdir, f"rank{r}.json")) as fh:
                ranks.append(json.load(fh))
        except (OSError, ValueError):
            pass
    import shutil
    shutil.rmtree(outdir, ignore_errors=True)
    expected = float(a.world_size * (a.world_size + 1) // 2)
    vals = [x["reduced"] for x in ranks]
    ok = rc == 0 and len(vals) == a.world_size and all(v == expected for v in vals)
    errs = [] if ok else [f"torchrun rc={rc}: " + " | ".join(err.strip().splitlines()[-3:])]
    print(json.dumps({"reduced": vals[0] if vals else None, "expected": expected, "ok": ok, "rdzv": a.rdzv,
                      "world_size": a.world_size, "ranks": ranks, "errors": errs}), flush=True)
    os._exit(0 if ok else 1)


def serve_store(a):
    import torch.distributed as dist
    skw = dict(wait_for_workers=False)
    if a.use_libuv is not None:
        skw["use_libuv"] = bool(a.use_libuv)
    try:
        return dist.TCPStore("127.0.0.1" if a.host in ("127.0.0.1", "localhost") else a.host, a.serve_store, None,
                             True, TD(seconds=a.timeout), **skw)
    except TypeError:
        skw.pop("use_libuv", None)
        return dist.TCPStore(a.host, a.serve_store, None, True, TD(seconds=a.timeout), **skw)


def launch(a):
    server = serve_store(a) if a.serve_store else None  # noqa: F841 (kept alive)
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo" if a.host.startswith("127.") or a.host == "localhost" else "")
    if not env["GLOO_SOCKET_IFNAME"]:
        del env["GLOO_SOCKET_IFNAME"]
    if a.rdzv == "agent":
        env.update(TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   MASTER_ADDR=a.host, MASTER_PORT=str(a.port))
    base = [sys.executable, "-W", "ignore", os.path.abspath(__file__), a.host, str(a.port), "--rdzv", a.rdzv,
            "--world-size", str(a.world_size), "--timeout", str(a.timeout)]
    if a.use_libuv is not None:
        base += ["--use-libuv", str(a.use_libuv)]
    procs = [subprocess.Popen(base + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(a.world_size)]
    deadline = time.monotonic() + a.timeout + 30
    ranks, ok, errs = [], True, []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errs.append(f"rank {r}: timeout")
        res = None
        for line in out.splitlines():
            try:
                res = json.loads(line)
            except ValueError:
                pass
        if p.returncode != 0 or res is None:
            ok = False
            errs.append(f"rank {r}: rc={p.returncode} {err.strip().splitlines()[-1:] if err.strip() else ''}")
        ranks.append(res)
    expected = float(a.world_size * (a.world_size + 1) // 2)
    vals = [x["reduced"] for x in ranks if x]
    ok = ok and len(vals) == a.world_size and all(v == expected for v in vals)
    print(json.dumps({"reduced": vals[0] if vals else None, "expected": expected, "ok": ok, "rdzv": a.rdzv,
                      "world_size": a.world_size, "ranks": ranks, "errors": errs}), flush=True)
    os._exit(0 if ok else 1)


def main():
    if os.environ.get("PG_JOB_ROLE") == "env-worker":  # one worker under torchrun
        env_worker(argparse.Namespace(timeout=float(os.environ.get("PG_JOB_TIMEOUT", "60"))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--rdzv", choices=["store", "agent", "tcp", "torchrun"], default="store")
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--rank", type=int, default=None, help="internal: run one worker")
    ap.add_argument("--serve-store", type=int, default=None, metavar="SPORT",
                    help="start a real TCPStore master on SPORT before launching the ranks")
    ap.add_argument("--use-libuv", type=int, choices=[0, 1], default=None)
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    if a.rank is None:
        launch_torchrun(a) if a.rdzv == "torchrun" else launch(a)
    else:
        worker(a)


if __name__ == "__main__":
    main()
