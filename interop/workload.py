#!/usr/bin/env python3
"""Drive every TCPStore operation the installed torch offers against HOST:PORT.

  workload.py HOST PORT --role master [--use-libuv 0|1] [--serve-seconds N]
      Starts a real TCPStore server (is_master=True, world_size None,
      wait_for_workers=False) on PORT (all interfaces, as torch does), prints
      {"ready": true, "port": PORT, "torch": ..., "backend": ...} on one line
      and serves until stdin closes, SIGTERM/SIGINT, or --serve-seconds pass.

  workload.py HOST PORT --role client [--use-libuv 0|1] [--prefix P] [--timeout S]
      Connects a TCPStore client (is_master=False, world_size None,
      wait_for_workers=False; use_libuv as given where the version has the flag:
      on a client it only matters for versions that reject unknown kwargs), runs
      every op available for the version, prints one JSON object
      {"torch", "generation", "ops": [{"op", "args", "result"|"error"}...], "ok"}
      and exits 0 if every op gave its expected result, 1 otherwise.
      Values are deterministic when no other client touches keys under PREFIX
      (num_keys is reported as the change across this run).

Runs under /usr/bin/python3 (Debian torch 1.13) and every venv of scripts/torch-envs.sh.
"""
import argparse
import datetime
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

TD = datetime.timedelta
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from capture import GEN_BY_MINOR  # noqa: E402
except Exception:  # pragma: no cover
    GEN_BY_MINOR = {}


def minor():
    p = torch.__version__.split("+")[0].split(".")
    return int(p[0]), int(p[1])


def store(host, port, is_master, use_libuv, timeout):
    kw = dict(wait_for_workers=False)
    if use_libuv is not None:
        kw["use_libuv"] = bool(use_libuv)
    try:
        return dist.TCPStore(host, port, None, is_master, TD(seconds=timeout), **kw)
    except TypeError:
        if "use_libuv" not in kw:
            raise
        if use_libuv:
            raise SystemExit(f"torch {torch.__version__} has no use_libuv flag")
        kw.pop("use_libuv")
        return dist.TCPStore(host, port, None, is_master, TD(seconds=timeout), **kw)


def norm(v):
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    return v


def run_client(a):
    st = store(a.host, a.port, False, a.use_libuv, a.timeout)
    P = a.prefix.rstrip("/") + "/"
    ops = []
    ok = True

    def op(name, fn, args, expect=None, expect_error=None, record=True):
        nonlocal ok
        rec = {"op": name, "args": [a_ for a_ in args]}
        try:
            r = norm(fn())
            rec["result"] = r
            if expect_error is not None:
                rec["mismatch"] = f"expected error {expect_error}"
                ok = False
            elif expect is not None and r != expect:
                rec["mismatch"] = f"expected {expect!r}"
                ok = False
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else ""
            if expect_error is not None and isinstance(e, expect_error):
                rec["error"] = type(e).__name__
            else:
                rec["error"] = f"{type(e).__name__}: {msg[:200]}"
                ok = False
        if record:
            ops.append(rec)
        return rec.get("result")

    # clean slate for our keys (delete is idempotent); not reported
    for k in ["k1", "bin", "cnt", "new", "nokey", "ap", "m1", "m2", "late", "bar"]:
        try:
            st.delete_key(P + k)
        except Exception:
            pass
    n0 = st.num_keys()

    op("set", lambda: st.set(P + "k1", "v1"), ["k1", "v1"])
    op("set", lambda: st.set(P + "bin", b"\x00\xff\x01"), ["bin", "\\x00\\xff\\x01"])
    op("get", lambda: st.get(P + "k1"), ["k1"], expect="v1")
    op("get", lambda: st.get(P + "bin"), ["bin"], expect="\x00\xff\x01")
    op("add", lambda: st.add(P + "cnt", 5), ["cnt", 5], expect=5)
    op("add", lambda: st.add(P + "cnt", -2), ["cnt", -2], expect=3)
    op("compare_set", lambda: st.compare_set(P + "k1", "v1", "v2"), ["k1", "v1", "v2"], expect="v2")
    op("compare_set", lambda: st.compare_set(P + "k1", "zz", "v3"), ["k1", "zz", "v3"], expect="v2")
    op("compare_set", lambda: st.compare_set(P + "nokey", "x", "y"), ["nokey", "x", "y"], expect="x")
    op("compare_set", lambda: st.compare_set(P + "new", "", "z"), ["new", "", "z"], expect="z")
    if hasattr(st, "check"):
        op("check", lambda: st.check([P + "k1"]), [["k1"]], expect=True)
        op("check", lambda: st.check([P + "missing"]), [["missing"]], expect=False)
    op("wait", lambda: st.wait([P + "k1", P + "cnt"]), [["k1", "cnt"]])
    op("wait", lambda: st.wait([P + "k1"], TD(seconds=5)), [["k1"], "5s"])
    op("wait_timeout", lambda: st.wait([P + "never"], TD(milliseconds=300)), [["never"], "0.3s"],
       expect_error=(RuntimeError,))  # DistStoreError subclasses RuntimeError
    n1 = op("num_keys", st.num_keys, [], record=False)
    ops.append({"op": "num_keys_delta", "args": [], "result": (n1 - n0) if isinstance(n1, int) else n1,
                "expect": 4})
    if isinstance(n1, int) and n1 - n0 != 4:
        ops[-1]["mismatch"] = "expected 4"
        ok = False
    op("delete_key", lambda: st.delete_key(P + "new"), ["new"], expect=True)
    op("delete_key", lambda: st.delete_key(P + "new"), ["new"], expect=False)
    if hasattr(st, "append"):
        op("append", lambda: st.append(P + "ap", "a"), ["ap", "a"])
        op("append", lambda: st.append(P + "ap", "bc"), ["ap", "bc"])
        op("get", lambda: st.get(P + "ap"), ["ap"], expect="abc")
    if hasattr(st, "multi_set"):
        op("multi_set", lambda: st.multi_set([P + "m1", P + "m2"], ["1", "22"]), [["m1", "m2"], ["1", "22"]])
    if hasattr(st, "multi_get"):
        op("multi_get", lambda: st.multi_get([P + "m1", P + "m2"]), [["m1", "m2"]], expect=["1", "22"])
    libuv = getattr(st, "libuvBackend", None)
    if hasattr(st, "queue_push"):
        q = P + "q"
        if a.queues:
            op("queue_push", lambda: st.queue_push(q, "x"), ["q", "x"])
            op("queue_push", lambda: st.queue_push(q, "yy"), ["q", "yy"])
            op("queue_len", lambda: st.queue_len(q), ["q"], expect=2)
            op("queue_pop", lambda: st.queue_pop(q, block=False), ["q", "block=False"], expect="x")
            op("queue_pop", lambda: st.queue_pop(q), ["q"], expect="yy")
            op("queue_len", lambda: st.queue_len(q), ["q"], expect=0)
        else:
            ops.append({"op": "queue_*", "skipped": "--queues 0 (legacy server has no queue ops)"})
    if hasattr(st, "list_keys"):
        r = op("list_keys", st.list_keys, [], record=False)
        mine = sorted(k[len(P):] for k in (r or []) if isinstance(k, str) and k.startswith(P))
        ops.append({"op": "list_keys", "args": [], "result": mine})
        want = ["ap", "bin", "cnt", "k1", "m1", "m2"] if hasattr(st, "append") else ["bin", "cnt", "k1"]
        if mine != want:
            ops[-1]["mismatch"] = f"expected {want}"
            ok = False
    if hasattr(st, "barrier"):
        op("barrier", lambda: st.barrier(P + "bar", 1), ["bar", 1])
    # a WAIT that another client satisfies (deferred reply)
    other = store(a.host, a.port, False, a.use_libuv, a.timeout)
    try:
        other.delete_key(P + "late")
    except Exception:
        pass
    waited = {}

    def other_wait():
        try:
            other.wait([P + "late"])
            waited["result"] = None
        except Exception as e:  # noqa: BLE001
            waited["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    th = threading.Thread(target=other_wait)
    th.start()
    time.sleep(0.2)
    op("set", lambda: st.set(P + "late", "1"), ["late", "1"])
    th.join(a.timeout)
    if th.is_alive():
        waited["error"] = "still waiting"
    ops.append(dict({"op": "wait_other_client", "args": [["late"]]}, **waited))
    if "error" in waited:
        ok = False
    if hasattr(st, "clone"):
        op("clone_get", lambda: st.clone().get(P + "k1"), ["k1"], expect="v2")
    print(json.dumps({"torch": torch.__version__.split("+")[0],
                      "generation": GEN_BY_MINOR.get(minor(), "G?"),
                      "libuvBackend": libuv, "ops": ops, "ok": ok}, sort_keys=True))
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def run_master(a):
    st = store(a.host, a.port, True, a.use_libuv, a.timeout)
    print(json.dumps({"ready": True, "port": getattr(st, "port", a.port), "torch": torch.__version__.split("+")[0],
                      "backend": ("libuv" if getattr(st, "libuvBackend", False) else "legacy")}), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def watch_stdin():
        try:
            while sys.stdin.read(4096):
                pass
        except Exception:
            return
        stop.set()
    if a.serve_seconds is None and not sys.stdin.isatty():
        threading.Thread(target=watch_stdin, daemon=True).start()
    stop.wait(a.serve_seconds)
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--role", choices=["master", "client"], required=True)
    ap.add_argument("--use-libuv", type=int, choices=[0, 1], default=None,
                    help="pass use_libuv (default: the version's default)")
    ap.add_argument("--prefix", default="wl")
    ap.add_argument("--timeout", type=float, default=30.0, help="store timeout, seconds")
    ap.add_argument("--queues", type=int, choices=[0, 1], default=None,
                    help="run queue ops (default: 1 unless --use-libuv 0; legacy servers lack them)")
    ap.add_argument("--serve-seconds", type=float, default=None)
    a = ap.parse_args()
    if a.queues is None:
        a.queues = 0 if a.use_libuv == 0 else 1
    if a.role == "master":
        run_master(a)
    else:
        run_client(a)


if __name__ == "__main__":
    main()
