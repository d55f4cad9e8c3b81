#!/usr/bin/env python3
"""A vLLM-style pickle broadcast through a TCPStore at HOST:PORT (vLLM's StatelessProcessGroup does
store.set(key, pickle.dumps(obj)) on the source rank and pickle.loads(store.get(key)) on the others).

  pickle_broadcast.py HOST PORT [--prefix bc] [--timeout 10] [--serve-store SPORT] [--objects ordinary|framework|all] [--each]

Two clients (two connections): the first SETs every object (--objects ordinary: dicts, lists, a datetime, a
tensor, torch.Size and dtypes, vLLM's PyNcclPipe metadata, a nested structure, ...; framework: a dataclass, a
namedtuple and them nested, the framework's own classes) at every pickle protocol the interpreter has,
raw and base64; the second GETs each and checks pickle.loads(value) == the object. Prints one JSON line
{"ok", "checked", "protocols", "mismatches": [...], "torch"} (or {"ok": false, "error"} when the SETs'
connection was closed); exit 0 iff ok.
"""
import argparse
import base64
import collections
import dataclasses
import datetime
import json
import os
import pickle
import sys

from policy_attack import client, serve_store  # noqa: E402  (interop/ is the script's directory)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Metadata:  # a dataclass as a framework broadcasts it (module pickle_broadcast, not __main__)
    name: str
    shape: tuple
    dtype: str
    ranks: list


Addr = collections.namedtuple("Addr", "host port")


def objects(which="ordinary"):
    """The objects broadcast: "ordinary" (builtins, datetime, torch's tensors, Size and dtypes: what the default
    allow-list holds), "framework" (a framework's own classes: a dataclass, a namedtuple, and them nested, which a
    policy file allows per key), or "all"."""
    import torch
    import pickle_broadcast as mod  # the classes as pickle_broadcast.Metadata / .Addr, importable by any reader
    when = datetime.datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=datetime.timezone.utc)
    meta = mod.Metadata("layer.0.weight", (4096, 4096), "bfloat16", [0, 1, 2, 3])
    ordinary = {
        "dict": {"rank": 3, "world_size": 8, "host": "node-3", "ok": True, "ratio": 0.25, "none": None},
        "list": [1, 2.5, "three", b"four", None, True, -7, 2 ** 70],
        "datetime": when,
        "tensor": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "nested": {"step": 1200, "sets": {frozenset({1, 2}), frozenset()}, "when": [when, datetime.date(2026, 1, 1)],
                   "blob": bytes(range(256)) * 4, "text": "ünïcødé ✓", "deep": [[[[{"x": [1, {"y": (2,)}]}]]]],
                   "meta": {"name": "layer.0.weight", "shape": torch.Size([4096, 4096]), "dtype": torch.bfloat16}},
        "set_bytes_complex": ({1, 2, 3}, bytearray(b"ba"), 3 + 4j, 1e300, -0.0),
        # vLLM's PyNcclPipe: send_obj({"dtype", "shape"}) before a tensor (vllm/distributed/kv_transfer/kv_pipe)
        "pynccl_metadata": {"dtype": torch.float16, "shape": torch.Size([2, 4096])},
        "collections": [collections.OrderedDict(a=1), collections.Counter("aab"), collections.deque([1, 2])],
    }
    framework = {
        "dataclass": meta,
        "namedtuple": mod.Addr("10.0.0.7", 29500),
        "nested_classes": {"metas": [meta, meta], "addrs": (mod.Addr("a", 1), mod.Addr("b", 2))},
    }
    return {"ordinary": ordinary, "framework": framework, "all": {**ordinary, **framework}}[which]


def same(a, b):
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def fail(error):
    print(json.dumps({"ok": False, "error": error}), flush=True)
    os._exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--prefix", default="bc")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--serve-store", type=int, metavar="SPORT", default=None,
                    help="first host a TCPStore master on 127.0.0.1:SPORT (the store behind HOST:PORT): "
                    "one torch start less")
    ap.add_argument("--objects", choices=["ordinary", "framework", "all"], default="ordinary")
    ap.add_argument("--each", action="store_true", help="diagnosis: every SET on a connection of its own, followed by "
                    "num_keys(); print the keys whose connection was closed instead of stopping at the first")
    a = ap.parse_args()
    import torch
    server = serve_store(a.serve_store) if a.serve_store else None  # noqa: F841 (kept alive)
    objs = objects(a.objects)
    protocols = list(range(pickle.HIGHEST_PROTOCOL + 1))
    src, dst = client(a.host, a.port, a.timeout), client(a.host, a.port, a.timeout)
    keys, closed = [], []
    for name, obj in objs.items():
        for proto in protocols:
            data = pickle.dumps(obj, protocol=proto)
            for form, value in (("raw", data), ("b64", base64.b64encode(data))):
                key = f"{a.prefix}/{name}/p{proto}/{form}"
                if a.each:
                    try:
                        one = client(a.host, a.port, a.timeout)
                        one.set(key, value)
                        one.num_keys()
                    except Exception as e:  # noqa: BLE001
                        closed.append(f"{key}: {type(e).__name__}")
                        continue
                else:
                    try:
                        src.set(key, value)
                    except Exception as e:  # noqa: BLE001
                        fail(f"set {key}: {type(e).__name__}: {e}"[:300])
                keys.append((key, name, form))
    if not a.each:
        try:  # SET has no reply: a round trip tells whether the connection is still open
            src.num_keys()
        except Exception as e:  # noqa: BLE001
            fail(f"num_keys after {len(keys)} SETs (the last {keys[-1][0]}): {type(e).__name__}: {e}"[:300])
    if a.each:
        print(json.dumps({"closed": closed, "passed": len(keys)}), flush=True)
        os._exit(0)
    mismatches, checked = [], 0
    for key, name, form in keys:
        got = dst.get(key)
        if form == "b64":
            got = base64.b64decode(got)
        back = pickle.loads(got)
        checked += 1
        if not same(objs[name], back):
            mismatches.append(key)
    ok = not mismatches and checked == len(objs) * len(protocols) * 2
    print(json.dumps({"ok": ok, "checked": checked, "protocols": protocols, "mismatches": mismatches,
                      "torch": torch.__version__.split("+")[0]}), flush=True)
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
