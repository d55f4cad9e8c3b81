#!/usr/bin/env python3
"""How many store connections a running job opens once it has started: what ban.serving-burst must
allow a host whose source is banned while it serves the job (docs/protocol-confirmed.md section 6).

  python3 interop/job_connections_after_start.py --bin storeguard [--versions 1.13.1,2.15.0]

For each release, a gloo job of 4 ranks in agent-store mode (init_method tcp://GUARD, every rank a
client) runs through a guard in front of a real store. After init_process_group and a barrier,
each rank notes the time, then makes three process groups (new_group of two ranks, of all, with a
backend named), runs barriers, all_reduce in the groups, broadcast_object_list and all_gather_object,
and destroys the process group. The guard's flow records say when each connection began: prints one
JSON line per release with the connections in all and those opened after every rank had started.
"""
import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TD = datetime.timedelta


def rank(r, world, port, out):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=world,
                            timeout=TD(seconds=120))
    dist.barrier()
    Path(out, f"started{r}").write_text(str(time.time()))
    time.sleep(1)
    pair, everyone, named = dist.new_group([0, 1]), dist.new_group(list(range(world))), dist.new_group(backend="gloo")
    for _ in range(3):
        dist.barrier()
    t = torch.tensor([1.0])
    dist.all_reduce(t, group=everyone)
    if r < 2:
        dist.all_reduce(t, group=pair)
    obj = [{"x": 1} if r == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    gathered = [None] * world
    dist.all_gather_object(gathered, r)
    dist.barrier(group=named)
    dist.destroy_process_group()


def measure(binary, version, python):
    from test_interop import free_port
    world, sport, port = 4, free_port(), free_port()
    out = tempfile.mkdtemp(prefix="job-conns-")
    store = subprocess.Popen([python, str(HERE / "workload.py"), "127.0.0.1", str(sport), "--role", "master"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    audit = Path(out, "audit.jsonl")
    guard = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{sport}",
                              "--metrics-listen", "", "--audit-log", str(audit)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert json.loads(store.stdout.readline()).get("ready")
        for _ in range(100):  # the guard listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        env = dict(os.environ, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        launched = time.time()
        ranks = [subprocess.Popen([python, "-W", "ignore", __file__, "--rank", str(r), "--world", str(world),
                                   "--port", str(port), "--out", out], env=env) for r in range(world)]
        rcs = [p.wait(timeout=300) for p in ranks]
        time.sleep(1)  # the last flow records
    finally:
        guard.terminate()
        guard.wait()
        store.terminate()
        store.wait()
    started = max(float(Path(out, f"started{r}").read_text()) for r in range(world) if Path(out, f"started{r}").exists())
    flows = [json.loads(line) for line in audit.read_text().splitlines() if '"flow"' in line]
    starts = [datetime.datetime.fromisoformat(f["event.start"].replace("Z", "+00:00")).timestamp() for f in flows
              if f.get("event.action") == "flow"]
    return {"version": version, "ok": all(rc == 0 for rc in rcs), "connections": sum(s > launched for s in starts),
            "opened_after_start": sum(s > started for s in starts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin")
    ap.add_argument("--versions", default="1.13.1,2.0.1,2.4.1,2.15.0")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.rank is not None:
        rank(a.rank, a.world, a.port, a.out)
        return
    from test_interop import ENVS
    for v in a.versions.split(","):
        print(json.dumps(measure(a.bin, v, ENVS[v])), flush=True)


if __name__ == "__main__":
    main()
