#!/usr/bin/env python3
"""What a clean torchrun c10d job writes to its rendezvous store, read from a recording relay between the
guard (default configuration) and a real store: the facts behind the policy stage's default rules.

  python3 interop/policy_facts.py [--versions 2.15.0,2.4.1,2.0.1] [--scenarios basic,restarts,nodes2,late]
                                  [--direct] [--dis]
  (STOREGUARD_BIN names the binary; default: go build. --direct: no guard, the agents use the relay;
  --dis: pickletools.dis of a state pickle per scenario. interop/results/policy-facts.md has its findings.)

Scenarios: basic (1 agent, 2 workers); restarts (--max-restarts 2, global rank 1 exits 1 on its first
attempt, before its process group); nodes2 (--nnodes 1:2, two agents with 1 worker each, started together); late (--nnodes 1:2, the
second agent joins while the first one's workers run, after a round of one: a membership change).
Prints, per release and scenario, markdown: the write table (wire key with the run id as <run_id>, op,
count, distinct connections), the ops on the rendezvous state key, and the globals and opcodes of the
state pickles (base64-decoded, read with pickletools, never loaded).
"""
import argparse
import base64
import collections
import os
import pickletools
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import store_trace  # noqa: E402
from test_auto_generation import Relay, generation  # noqa: E402
from test_interop import ROOT, Procs, default_backend, start_store  # noqa: E402
from test_policy import Job, guarded_store, relay_writes, result_problems, started  # noqa: E402

SENTINEL = b"Y2FuaW1hZGFt"


def pickle_globals(data):
    """(globals, opcodes) of a pickle, by reading it: STACK_GLOBAL resolved through the strings pushed and memoized."""
    strings, memo, globs, ops = [], {}, [], collections.Counter()
    for op, arg, _ in pickletools.genops(data):
        ops[op.name] += 1
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
                       "STRING"):
            strings.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = strings[-1] if strings else None
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = strings[-1] if strings else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            strings.append(memo.get(arg))
        elif op.name == "STACK_GLOBAL":
            globs.append(f"{strings[-2]}.{strings[-1]}")
        elif op.name in ("GLOBAL", "INST"):
            globs.append(arg.replace(" ", "."))
    return globs, ops


class NoGuard:
    """--direct: the agents talk to the relay in front of the store, no guard."""

    def __init__(self, relay):
        self.port = relay.port

    def events(self):
        return []


def scenario(binary, version, name, tmp, direct=False):
    ps = Procs()
    run_id = "facts" + uuid.uuid4().hex[:6]
    try:
        if direct:
            _, sport = start_store(ps, version, default_backend(version))
            relay = Relay(ps, sport, tmp)
            guard = NoGuard(relay)
        else:
            relay, guard = guarded_store(ps, binary, tmp, version)
        out = tmp / "out"
        if name == "basic":
            jobs = [Job(ps, version, guard.port, tmp, run_id, out, seconds=2)]
        elif name == "restarts":
            jobs = [Job(ps, version, guard.port, tmp, run_id, out, max_restarts=2, fail_once=1, seconds=1)]
        elif name == "nodes2":
            jobs = [Job(ps, version, guard.port, tmp, run_id, out, name=f"node{i}", nnodes="1:2", nproc=1, seconds=1)
                    for i in range(2)]
        elif name == "late":
            jobs = [Job(ps, version, guard.port, tmp, run_id, out, name="node0", nnodes="1:2", nproc=1, seconds=10,
                        rdzv_conf="last_call_timeout=1")]
            deadline = time.monotonic() + 90
            while not started(out, 1) and time.monotonic() < deadline:
                time.sleep(0.2)
            jobs.append(Job(ps, version, guard.port, tmp, run_id, out, name="node1", nnodes="1:2", nproc=1, seconds=10))
        else:
            raise ValueError(name)
        rcs = [j.wait(240) for j in jobs]
        probs = result_problems(out, 2)
        time.sleep(0.5)
        evs = guard.events()
        rows = relay_writes(relay, version)
        trace = store_trace.trace(relay.dir, generation(version, default_backend(version)))
        return {"rcs": rcs, "problems": probs, "events": evs, "rows": rows, "trace": trace, "run_id": run_id,
                "tails": [j.tail(8) for j in jobs] if any(rcs) or probs else []}
    finally:
        ps.stop_all()


def report(version, name, r, dis=False):
    """Markdown for one scenario: the keys table, the state key's ops, the state pickles."""
    rid = r["run_id"].encode()
    norm = lambda k: k.replace(rid, b"<run_id>").decode("latin-1")  # noqa: E731
    print(f"\n### {version} {name}: agents rc {r['rcs']}, results {'ok' if not r['problems'] else r['problems']}, "
          f"guard findings {len(r['events'])}")
    for t in r["tails"]:
        print("```\n" + t + "\n```")
    writes = store_trace.write_table([(c, op, norm(k).encode(), v) for c, op, k, v in r["rows"]])
    reads = collections.defaultdict(collections.Counter)
    for conn, op, fields in r["trace"]:
        if op in store_trace.WRITE_OPS or not fields:
            continue
        for k in (fields[0] if isinstance(fields[0], list) else [fields[0]]):
            if isinstance(k, bytes):
                reads[norm(k)][op] += 1
    print("\n| wire key | writes: op ×count (connections) | reads |\n|---|---|---|")
    for key in sorted(set(k.decode() for k in writes) | set(reads)):
        w = writes.get(key.encode(), {})
        print(f"| `{key}` | " + ", ".join(f"{op} ×{c} ({n})" for op, (c, n) in sorted(w.items())) + " | "
              + ", ".join(f"{op} ×{c}" for op, c in sorted(reads.get(key, {}).items())) + " |")
    state = b"/torch.rendezvous." + rid
    sops = collections.Counter()
    globs, opcodes, protos, npick, last = collections.Counter(), collections.Counter(), set(), 0, None
    for conn, op, fields in r["trace"]:
        keys = fields[0] if fields and isinstance(fields[0], list) else ([fields[0]] if fields else [])
        keys = [k[0] if isinstance(k, tuple) else k for k in keys]
        if state not in keys:
            continue
        desc = op
        if op == "COMPARE_SET":
            exp, des = fields[1], fields[2]
            desc += " expected=" + ("''" if exp == b"" else "SENTINEL" if exp == SENTINEL else "state") + \
                    " desired=" + ("SENTINEL" if des == SENTINEL else "state")
        if op in ("SET",):
            desc += " value=" + ("SENTINEL" if fields[1] == SENTINEL else "state")
        sops[desc] += 1
        vals = []
        if op == "COMPARE_SET":
            vals = [fields[1], fields[2]]
        elif op == "SET":
            vals = [fields[1]]
        for v in vals:
            if v and v != SENTINEL:
                raw = base64.b64decode(v)
                npick += 1
                last = raw
                g, o = pickle_globals(raw)
                globs.update(set(g))
                opcodes.update(o)
                protos.add(raw[1] if raw[:1] == b"\x80" else 0)
    print(f"\nops on `/torch.rendezvous.<run_id>`: " + ", ".join(f"{d} ×{c}" for d, c in sorted(sops.items())))
    print(f"\nstate pickles: protocol {sorted(protos)}; globals {sorted(globs)}; "
          f"opcodes {dict(sorted(opcodes.items()))} (summed over {npick} pickles)")
    if dis and last:
        import io
        buf = io.StringIO()
        pickletools.dis(last, out=buf)
        print("\nthe last state pickle (desired value of the last COMPARE_SET), pickletools.dis:\n```\n"
              + buf.getvalue() + "```")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--versions", default="2.15.0,2.4.1,2.0.1")
    ap.add_argument("--scenarios", default="basic,restarts,nodes2,late")
    ap.add_argument("--direct", action="store_true", help="no guard: the agents use the relay in front of the store")
    ap.add_argument("--dis", action="store_true", help="print pickletools.dis of a state pickle per scenario")
    a = ap.parse_args()
    binary = os.environ.get("STOREGUARD_BIN")
    if not binary:
        binary = os.path.join(tempfile.mkdtemp(), "storeguard")
        subprocess.run(["go", "build", "-o", binary, "./cmd/storeguard"], cwd=ROOT, check=True)
    for v in a.versions.split(","):
        for s in a.scenarios.split(","):
            tmp = Path(tempfile.mkdtemp(prefix=f"facts-{v}-{s}-"))
            report(v, s + (" (direct, no guard)" if a.direct else ""), scenario(binary, v, s, tmp, a.direct), a.dis)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
