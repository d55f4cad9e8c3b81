#!/usr/bin/env python3
"""How many connections a job's ranks open to the store, per torch release, measured through the
guard: what caps.per-source-connections and caps.per-source-store-connections must allow one host.

  python3 interop/rank_connections.py [--world-size 8] [--versions 1.13.1,2.15.0] [--bin storeguard]

For each release, a gloo job of world_size ranks on this host (pg_job.py: init_process_group with
init_method tcp:// in agent-store mode, every rank a client; and for 2.x torchrun's c10d rendezvous,
where the agent alone connects) runs through a guard with default caps. The guard's metrics are read
every 10 ms: the peak of client connections open (connections_active), the peak of store connections
(store_connections: a client's from its first valid message) and the connections accepted in all.
Prints a markdown table, per job and per rank.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_interop import ENVS, default_backend, free_port, minor, wait_ready  # noqa: E402


def metrics(mport):
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=2) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line.startswith("storeguard_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def measure(binary, version, rdzv, world):
    sport, port, mport = free_port(), free_port(), free_port()
    log = tempfile.NamedTemporaryFile(prefix="rank-conns-", suffix=".log", delete=False)
    guard = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{sport}",
                              "--metrics-listen", f"127.0.0.1:{mport}"], stdout=log, stderr=log)
    try:
        peak = {"active": 0, "store": 0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    m = metrics(mport)
                    peak["active"] = max(peak["active"], m.get("storeguard_connections_active", 0))
                    peak["store"] = max(peak["store"], m.get("storeguard_store_connections", 0))
                except OSError:
                    pass
                time.sleep(0.01)

        for _ in range(100):
            try:
                metrics(mport)
                break
            except OSError:
                time.sleep(0.05)
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        args = [ENVS[version], str(HERE / "pg_job.py"), "127.0.0.1", str(port), "--rdzv", rdzv,
                "--serve-store", str(sport), "--world-size", str(world)]
        if rdzv == "agent" and minor(version) >= (2, 2):
            args += ["--use-libuv", "1" if default_backend(version) == "libuv" else "0"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        stop.set()
        t.join()
        m = metrics(mport)
        ok = p.returncode == 0
        return {"version": version, "rdzv": rdzv, "world": world, "ok": ok,
                "accepted": int(m.get("storeguard_connections_accepted_total", 0)),
                "peak_clients": int(peak["active"]), "peak_store": int(peak["store"]),
                "err": "" if ok else (p.stdout[-300:] + p.stderr[-300:])}
    finally:
        guard.terminate()
        guard.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--versions", default=",".join(ENVS))
    ap.add_argument("--bin", default=os.environ.get("STOREGUARD_BIN"))
    a = ap.parse_args()
    binary = a.bin
    if not binary:
        binary = os.path.join(tempfile.mkdtemp(), "storeguard")
        subprocess.run(["go", "build", "-o", binary, "./cmd/storeguard"], cwd=HERE.parent, check=True)
    print("| torch | rendezvous | ranks | ok | accepted | peak client connections | peak store connections | "
          "store connections per rank |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for v in a.versions.split(","):
        for rdzv in ["agent"] + (["torchrun"] if minor(v) >= (2, 0) else []):
            r = measure(binary, v, rdzv, a.world_size)
            per = r["peak_store"] / a.world_size
            print(f"| {v} | {rdzv} | {a.world_size} | {'yes' if r['ok'] else 'NO ' + json.dumps(r['err'])} | "
                  f"{r['accepted']} | {r['peak_clients']} | {r['peak_store']} | {per:.2f} |", flush=True)


if __name__ == "__main__":
    main()
