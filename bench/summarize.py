"""Turn bench/side-by-side.sh's raw results into docs/benchmarks.md (printed to stdout).

usage: python3 summarize.py OUT_DIR
"""
import datetime
import glob
import json
import os
import re
import statistics
import sys

TARGETS = ["direct", "storeguard", "haproxy"]


def load(out):
    """(store, target, workload) -> [result], and the same keyed by repetition ((..., rep) -> result)."""
    runs, by_rep = {}, {}
    for f in sorted(glob.glob(os.path.join(out, "runs", "*", "*", "*.json"))):
        store, target = f.split(os.sep)[-3:-1]
        m = re.match(r"(.+)-(\d+)-(\d+)\.json$", os.path.basename(f))
        if not m:
            continue
        try:
            with open(f) as fh:
                r = json.load(fh)
        except (OSError, ValueError):
            r = None  # the run crashed or timed out: counted as a failed run
        key = (store, target, f"{m.group(1)}:{m.group(2)}")
        runs.setdefault(key, []).append(r)
        by_rep[key + (int(m.group(3)),)] = r
    return runs, by_rep


def completed(runs, store, wl, targets=TARGETS):
    """target -> the runs of a workload that produced a result (a crashed run has none)."""
    return {t: [r for r in runs.get((store, t, wl), []) if r] for t in targets}


def paired(by_rep, store, wl, get, a="storeguard", b="haproxy"):
    """a/b of get(result) for each repetition both ran: runs are interleaved, so a pair shares the
    machine's state of the moment."""
    out = []
    for (st, t, w, rep), r in by_rep.items():
        if (st, t, w) != (store, a, wl) or not r:
            continue
        o = by_rep.get((store, b, wl, rep))
        if o and get(r) and get(o):
            out.append(get(r) / get(o))
    return sorted(out)


def spread(ratios):
    return f"{ratios[0]:.2f}–{ratios[-1]:.2f}" if ratios else "–"


def added(ok, q="p50"):
    """Median latency each proxy adds over direct at q, in µs."""
    lat = {t: med([r["latency_us"][q] for r in ok[t]]) for t in TARGETS}
    if lat["direct"] is None:
        return {}
    return {t: lat[t] - lat["direct"] for t in ("storeguard", "haproxy") if lat[t] is not None}


def targets(p, runs, by_rep, stores, out):
    """The issue's targets, one line each, from the same runs as the tables below."""
    p("## Targets")
    p()
    p("What the performance issue asks, as measured in this run (per-run ratios pair the runs of one "
      "repetition; medians are over repetitions).")
    p()
    p("| target | " + " | ".join(stores) + " |")
    p("|---|" + "---|" * len(stores))
    cells = {k: [] for k in ("ops", "lat", "rdz", "cpu", "opcpu")}
    for store in stores:
        ok = lambda wl: completed(runs, store, wl)
        rows, cpu = [], []  # storeguard / HAProxy: (ops/s, workload), CPU per operation
        for wl in sorted({k[2] for k in runs if k[0] == store and not k[2].startswith("rendezvous")}, key=order):
            o = ok(wl)
            sg, ha = med([r.get("ops_per_sec") for r in o["storeguard"]]), med([r.get("ops_per_sec") for r in o["haproxy"]])
            if sg and ha:
                rows.append((sg / ha, wl))
            sg, ha = op_cpu(o, "storeguard"), op_cpu(o, "haproxy")
            if sg and ha:
                cpu.append(sg / ha)
        if rows:
            geo = statistics.geometric_mean([r for r, _ in rows])
            low = min(rows)
            cells["ops"].append(f"{sum(r >= 1 for r, _ in rows)} of {len(rows)} at ≥ 1.00; lowest "
                                f"{low[0]:.2f} (`{low[1]}`); geometric mean {geo:.2f}")
        else:
            cells["ops"].append("–")
        lat = []
        for wl in ("get:1", "mix:1"):
            a = added(ok(wl))
            if a.get("haproxy"):
                lat.append(f"`{wl}` {a['storeguard']:.1f} vs {a['haproxy']:.1f} µs "
                           f"({a['storeguard'] / a['haproxy']:.2f})")
        cells["lat"].append("; ".join(lat) or "–")
        rdz = []
        for wl in sorted({k[2] for k in runs if k[0] == store and k[2].startswith("rendezvous")}, key=order):
            tot = {t: med([rdz_total(r) for r in runs.get((store, t, wl), [])]) for t in ("direct", "storeguard")}
            errs = errors(runs.get((store, "storeguard", wl), []))
            if tot["storeguard"] and tot["direct"]:
                rdz.append(f"`{wl}` {tot['storeguard'] / tot['direct']:.2f}, {errs} errors")
            elif runs.get((store, "storeguard", wl)):
                rdz.append(f"`{wl}` incomplete, {errs} errors")
        cells["rdz"].append("; ".join(rdz) or "–")
        cells["cpu"].append(storm_cpu(runs, store))
        cells["opcpu"].append(f"geometric mean {statistics.geometric_mean(cpu):.2f}, {min(cpu):.2f} to {max(cpu):.2f} "
                              f"over {len(cpu)} workloads" if cpu else "–")
    p("| ops/s at 1, 16, 64 connections: storeguard / HAProxy ≥ 1.00 | " + " | ".join(cells["ops"]) + " |")
    p("| median added latency at 1 connection (p50 minus direct's): storeguard vs HAProxy, ≤ 1.00 | " +
      " | ".join(cells["lat"]) + " |")
    p("| rendezvous storm: storeguard / direct ≤ 1.20, no errors | " + " | ".join(cells["rdz"]) + " |")
    if any(c != "–" for c in cells["opcpu"]):
        p("| proxy CPU per operation (the closed-loop workloads): storeguard / HAProxy | " +
          " | ".join(cells["opcpu"]) + " |")
    if any(c != "–" for c in cells["cpu"]):
        p("| CPU per client in the rendezvous storm (each proxy's, the store's; medians), and the most a "
          "proxy could spend for 1.20 on this machine | " + " | ".join(cells["cpu"]) + " |")
    p()
    idle = os.path.join(out, "idle.txt")
    if os.path.exists(idle):
        held = {}
        for line in open(idle):
            target, n, before, after, fds = line.split()
            held[target] = (int(n), (int(after) - int(before)) / int(n))
        if "storeguard" in held:
            n, per = held["storeguard"]
            p(f"- Idle connections, RSS ≤ 16 KiB each at 20,000: storeguard held {n:,} at {per:.1f} KiB each" +
              (f" (HAProxy {held['haproxy'][1]:.1f})" if "haproxy" in held else "") +
              "; the descriptor limit (Machine) caps the count.")
            p()


def proc_cpu(r, proxy):
    """(store, proxy) CPU seconds of a run over its measured interval, from the processes the
    bench watched: the proxy by its name (storeguard, haproxy), the store the other one."""
    st = px = None
    for pr in ((r or {}).get("cpu") or {}).get("processes") or []:
        if pr["name"] == proxy:
            px = pr["cpu_s"]
        else:
            st = pr["cpu_s"]
    return st, px


def storm_cpu(runs, store):
    """The proxies' and the store's CPU per client in the repeated rendezvous storm, and what the
    direct storm left of the machine: the most a proxy could spend per client for 1.20."""
    wls = sorted({k[2] for k in runs if k[0] == store and k[2].startswith("rendezvous")}, key=order)
    if not wls:
        return "–"
    wl, n = wls[0], int(wls[0].split(":")[1])
    get = {}
    for t in TARGETS:
        vals = [proc_cpu(r, t) for r in completed(runs, store, wl, [t])[t]]
        get[t] = tuple(med([v[i] for v in vals]) for i in (0, 1))
    parts = [f"{t} {get[t][1] * 1e6 / n:.0f}" for t in ("storeguard", "haproxy") if get[t][1] is not None]
    if not parts:
        return "–"
    text = "proxy: " + ", ".join(parts) + " µs; store: " + ", ".join(
        f"{t} {get[t][0] * 1e6 / n:.0f}" for t in TARGETS if get[t][0] is not None) + " µs"
    # At 1.20 x the direct time, a proxy gets the cores' time over that wall less what the direct
    # storm kept them busy with.
    rooms, utils = [], []
    for r in runs.get((store, "direct", wl), []):
        c = (r or {}).get("cpu") or {}
        if c.get("cores") and r.get("duration_s"):
            wall = r["duration_s"]
            utils.append(c["cores_busy_s"] / (wall * c["cores"]))
            rooms.append(max(0.0, 1.2 * wall * c["cores"] - c["cores_busy_s"]) / n * 1e6)
    if rooms:
        text += (f"; cores busy in the direct storm {med(utils):.0%}, leaving a proxy at most "
                 f"{med(rooms):.0f} µs for 1.20")
    return f"`{wl}` " + text


def op_cpu(ok, t):
    """A proxy's median CPU per operation in µs over a closed-loop workload's runs."""
    return med([proc_cpu(r, t)[1] / r["ops"] * 1e6 for r in ok.get(t, []) if r.get("ops") and proc_cpu(r, t)[1] is not None])


def rdz_total(r):
    """A rendezvous run's time; None if it did not release every client (no meaningful time)."""
    rv = (r or {}).get("rendezvous") or {}
    return rv.get("total_s") if rv.get("completed") == rv.get("clients") else None


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    if v is None:
        return "–"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def ratio(a, b):
    if a is None or b in (None, 0):
        return "–"
    return f"{a / b:.2f}"


def errors(rs):
    n = 0
    for r in rs:
        n += 1 if r is None else r.get("errors", 0)
    return n


def order(workload):
    op, conns = workload.split(":")
    return (op == "rendezvous", op, int(conns))


def paths(p, runs, store):
    """A table of storeguard's two forwarding paths, event loops and goroutines, against HAProxy."""
    alt = "storeguard-goroutines"
    workloads = sorted({k[2] for k in runs if k[0] == store and k[1] == alt}, key=order)
    if not workloads:
        return
    p(f"Forwarding paths on {store}: storeguard as configured by default (event loops) and with "
      "`event-loops: -1` (two goroutines per connection), same run.")
    p()
    p("| workload | metric | loops | goroutines | haproxy | loops/haproxy | goroutines/haproxy |")
    p("|---|---|---:|---:|---:|---:|---:|")
    for wl in workloads:
        ok = completed(runs, store, wl, ("storeguard", alt, "haproxy"))
        metrics = [("ops/s", lambda r: r.get("ops_per_sec"), 0)]
        if wl.endswith(":1"):
            metrics.append(("latency p50 µs", lambda r: r["latency_us"]["p50"], 1))
        for name, get, digits in metrics:
            v = {t: med([get(r) for r in ok[t]]) for t in ok}
            p(f"| `{wl}` | {name} | {fmt(v['storeguard'], digits)} | {fmt(v[alt], digits)} | "
              f"{fmt(v['haproxy'], digits)} | {ratio(v['storeguard'], v['haproxy'])} | {ratio(v[alt], v['haproxy'])} |")
    p()


def main():
    out = sys.argv[1]
    runs, by_rep = load(out)
    machine = open(os.path.join(out, "machine.txt")).read().strip().splitlines()
    stores_txt = os.path.join(out, "stores.txt")
    stores_seen = open(stores_txt).read().strip().splitlines() if os.path.exists(stores_txt) else []
    p = print
    p("# storeguard benchmarks")
    p()
    p(f"Generated by `bench/side-by-side.sh` on {datetime.date.today().isoformat()}; raw JSON in "
      f"`{out}` at the time of the run. Re-run the script to refresh this file. Replay against "
      "tshark is in docs/benchmarks-replay.md (`bench/replay-vs-tshark.sh`).")
    p()
    p("## Machine")
    p()
    for line in machine:
        p(f"- {line}")
    for line in stores_seen:
        p(f"- store {line}")
    p()
    p("## Method")
    p()
    p("- Workloads are `storeguard bench` runs (closed loop: one request in flight per connection). "
      "`get` is GET of existing 64-byte values over 1000 keys; `mix` is 70 % GET, 20 % SET, 10 % ADD, "
      "where a SET is written together with a GETNUMKEYS and timed until that reply (SET has none). "
      "Latency is per request, from the write until the whole reply is read.")
    p("- `rendezvous:N` is the start-up storm of a world_size N job: N clients connect (at most 256 "
      "dials in flight, retrying refused/EADDRNOTAVAIL), handshake (VALIDATE+PING from torch 2.5's "
      "generation on), ADD the init key, and WAIT on a key the last one sets; all N connections stay "
      "open until every client is released. The metric is the wall time of the whole rendezvous.")
    p("- Each target is measured against the same store process: `direct`; `storeguard serve` "
      "(enforce mode, metrics off, audit log to a file, per-source caps off so one loopback source may "
      "open N connections); HAProxy 2.6 `mode tcp`, 2 threads, `maxconn 200000`, `timeout "
      "client/server 1h`.")
    p("- storeguard forwards with its defaults: its event loops (one per CPU, 2 here) accept, and as "
      "the store is on the same host, each connection is connected to it at once and forwarded by a "
      "loop from its first byte; serve runs GOMAXPROCS one above the loops (3). The closed-loop "
      "workloads also run through a second storeguard with `event-loops: -1` (two goroutines per "
      "connection, the forwarding before the loops) in the same interleaved run; see the table under "
      "each store.")
    p("- Runs are interleaved: for each repetition, each workload runs against direct, storeguard and "
      "HAProxy in turn. Values are medians over the repetitions (the `runs` column; the larger "
      "storms run once per target to stay within the time budget).")
    p("- File descriptors: this machine's RLIMIT_NOFILE is 20000 and cannot be raised, and a proxy holds "
      "two per connection, so at most ~9850 clients fit through one proxy process. The 9000-client storm "
      "runs on every target; the 16384-client storm runs directly and, on the libuv store, through each "
      "proxy with a 20 s timeout to show what happens at the limit.")
    p("- CPU: each run reads /proc over its measured interval (after warm-up; a storm from the first "
      "dial to the last client released): the time all cores were busy, and the store's and the "
      "proxy's own CPU time (`storeguard bench --watch-pid`). Per operation and per client below; "
      "the clock tick is 10 ms, so a 2 s run resolves a proxy's CPU to about 1 %.")
    p("- Client, proxy and store share the machine's 2 cores; nothing is pinned. A proxy therefore "
      "also costs the others CPU: the ratios are what a single host sees, not a proxy in isolation.")
    p("- The torch 2.x stores call getnameinfo() for each accepted connection (the libuv backend on "
      "its only event-loop thread). On this loopback-only machine the configured resolver does not "
      "answer, which stalls the store ~5 s per connection in a storm; the script gives the stores a "
      "resolv.conf pointing at 127.0.0.1 (in a private mount namespace) so lookups fail at once.")
    p()
    p("Ratios: for ops/s below 1.00 means slower than the reference; for latency and rendezvous time "
      "above 1.00 means slower.")
    p()
    stores = sorted({k[0] for k in runs}, key=lambda s: (not s.startswith("torch1"), "libuv" in s, s))
    targets(p, runs, by_rep, stores, out)
    for store in stores:
        p(f"## {store}")
        p()
        p("| workload | metric | direct | storeguard | haproxy | sg/direct | haproxy/direct | sg/haproxy | "
          "sg/haproxy per run | errors d/sg/h | runs |")
        p("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        workloads = sorted({k[2] for k in runs if k[0] == store}, key=order)
        for wl in workloads:
            rs = {t: runs.get((store, t, wl), []) for t in TARGETS}
            errs = "/".join(str(errors(rs[t])) for t in TARGETS)
            nruns = "/".join(str(len(rs[t])) for t in TARGETS)
            ok = completed(runs, store, wl)
            if wl.startswith("rendezvous"):
                vals = {t: med([rdz_total(r) for r in ok[t]]) for t in TARGETS}
                done = {t: med([(r.get("rendezvous") or {}).get("completed") for r in ok[t]]) for t in TARGETS}
                row = [f"`{wl}`", "total s (median)"] + [fmt(vals[t], 2) for t in TARGETS]
                row += [ratio(vals["storeguard"], vals["direct"]), ratio(vals["haproxy"], vals["direct"]),
                        ratio(vals["storeguard"], vals["haproxy"]), spread(paired(by_rep, store, wl, rdz_total)),
                        errs, nruns]
                p("| " + " | ".join(row) + " |")
                if any(done[t] is not None and done[t] < int(wl.split(":")[1]) for t in TARGETS):
                    p(f"| `{wl}` | clients released | " + " | ".join(fmt(done[t]) for t in TARGETS) +
                      " | | | | | | |")
                continue
            ops = {t: med([r.get("ops_per_sec") for r in ok[t]]) for t in TARGETS}
            row = [f"`{wl}`", "ops/s"] + [fmt(ops[t]) for t in TARGETS]
            row += [ratio(ops["storeguard"], ops["direct"]), ratio(ops["haproxy"], ops["direct"]),
                    ratio(ops["storeguard"], ops["haproxy"]),
                    spread(paired(by_rep, store, wl, lambda r: r.get("ops_per_sec"))), errs, nruns]
            p("| " + " | ".join(row) + " |")
            cpu = {t: op_cpu(ok, t) for t in ("storeguard", "haproxy")}
            if cpu["storeguard"] and cpu["haproxy"]:
                p(f"| `{wl}` | proxy CPU µs/op | | {cpu['storeguard']:.1f} | {cpu['haproxy']:.1f} | | | "
                  f"{cpu['storeguard'] / cpu['haproxy']:.2f} | | | |")
            if wl.endswith(":1"):
                for q in ("p50", "p99"):
                    lat = {t: med([r["latency_us"][q] for r in ok[t]]) for t in TARGETS}
                    row = [f"`{wl}`", f"latency {q} µs"] + [fmt(lat[t], 1) for t in TARGETS]
                    row += [ratio(lat["storeguard"], lat["direct"]), ratio(lat["haproxy"], lat["direct"]),
                            ratio(lat["storeguard"], lat["haproxy"]),
                            spread(paired(by_rep, store, wl, lambda r, q=q: r["latency_us"][q])), "", ""]
                    p("| " + " | ".join(row) + " |")
                a = added(ok)
                if a.get("haproxy"):
                    p(f"| `{wl}` | added latency p50 µs | | {a['storeguard']:.1f} | {a['haproxy']:.1f} | | | "
                      f"{a['storeguard'] / a['haproxy']:.2f} | | | |")
        p()
        paths(p, runs, store)
    idle = os.path.join(out, "idle.txt")
    if os.path.exists(idle):
        p("## Idle connections")
        p()
        p("Clients connect through the proxy, handshake (VALIDATE+PING) and then stay silent, as torch "
          "workers blocked in a WAIT do. The upstream is storeguard's Go fake store (`storeguard bench "
          "fake-store`), not torch: the same sink for both proxies. RSS is the proxy process's VmRSS "
          "from /proc before the clients connect and while all of them are held.")
        p()
        p("| proxy | connections | RSS before KiB | RSS held KiB | KiB per connection | open fds held |")
        p("|---|---:|---:|---:|---:|---:|")
        for line in open(idle):
            target, n, before, after, fds = line.split()
            per = (int(after) - int(before)) / int(n)
            p(f"| {target} | {int(n):,} | {int(before):,} | {int(after):,} | {per:.1f} | {int(fds):,} |")
        for f in sorted(glob.glob(os.path.join(out, "idle-*.json"))):
            try:
                r = json.load(open(f))
            except (OSError, ValueError):
                continue
            c = r.get("connect", {})
            p()
            p(f"- {os.path.basename(f)[5:-5]}: {c.get('ok')} connected, {c.get('failed')} failed, "
              f"{r.get('errors')} errors, set-up {c.get('seconds', 0):.1f} s")
        p()
    for target in ("storeguard", "haproxy"):
        f = os.path.join(out, f"perf-{target}-self.txt")
        if os.path.exists(f) and os.path.getsize(f) > 0:
            if target == "storeguard":
                p("## CPU profiles under `get` x16 (torch 2.6 libuv store)")
                p()
                p("`perf record -g -p PID` of the proxy process for 5 s while `storeguard bench --op get "
                  "--conns 16` runs through it; self time by symbol, top 20.")
                p()
            p(f"### {target}")
            p()
            p("```")
            dso = os.path.join(out, f"perf-{target}-dso.txt")
            if os.path.exists(dso):
                p("by DSO:")
                for line in open(dso).read().splitlines():
                    p(line.rstrip())
                p("by symbol:")
            for line in open(f).read().splitlines()[:20]:
                p(line.rstrip())
            p("```")
            p()


if __name__ == "__main__":
    main()
