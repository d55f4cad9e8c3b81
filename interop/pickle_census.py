#!/usr/bin/env python3
"""What pickles torch and the frameworks write, and every call an attacker could pickle instead (issue #41).

  pickle_census.py written            # JSON lines: {"name", "protocol", "value" (hex), "globals": [module.name]}
  pickle_census.py census [--limit N] # JSON lines: {"global": "module.name", "value" (hex)}, one per callable

`written` pickles, at every protocol the interpreter has, the objects that torch and the frameworks put in a
TCPStore and whose readers unpickle: torchrun's rendezvous state (dynamic_rendezvous._RendezvousState with its
_NodeDesc and datetimes, as the c10d backend builds it), tensors of every dtype (a vLLM-style broadcast of a
tensor), torch.Size, dtypes, devices, vLLM's PyNcclPipe metadata ({"dtype", "shape"}), a ctypes structure as
vLLM's ncclUniqueId pickles, and the ordinary containers and scalars a StatelessProcessGroup broadcast carries.
Each record names the globals pickle.loads imports for it (a recording Unpickler: find_class is called, nothing
else is done differently; these are this script's own pickles).

`census` imports torch and torch.distributed, then for every module in sys.modules (the standard library's and
torch's) and every module-level callable in it, writes a protocol-4 pickle that calls it with one str argument:
PROTO 4, STACK_GLOBAL(module, qualified name), the argument, TUPLE1, REDUCE, STOP. It does not unpickle them.
"""
import _compat_pickle
import argparse
import collections
import ctypes
import datetime
import fractions
import decimal
import io
import json
import pickle
import struct
import sys
import uuid


class Recorder(pickle.Unpickler):
    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.seen = []
        self.proto = data[1] if data[:1] == b"\x80" else 0

    def find_class(self, module, name):
        if self.proto < 3:  # what find_class imports after fix_imports, as the guard's scanner reports it
            module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        self.seen.append(f"{module}.{name}")
        return super().find_class(module, name)


class NcclUniqueId(ctypes.Structure):  # vllm/distributed/device_communicators/pynccl_wrapper.py's ncclUniqueId
    _fields_ = [("internal", ctypes.c_byte * 128)]


# Pickled under vLLM's own name, as PyNcclCommunicator's broadcast_obj of its unique id is; the module is made
# here so that the pickle loads back without a vLLM install.
VLLM_WRAPPER = "vllm.distributed.device_communicators.pynccl_wrapper"
NcclUniqueId.__module__, NcclUniqueId.__qualname__, NcclUniqueId.__name__ = VLLM_WRAPPER, "ncclUniqueId", "ncclUniqueId"
for _i, _m in enumerate(VLLM_WRAPPER.split(".")):
    sys.modules.setdefault(".".join(VLLM_WRAPPER.split(".")[:_i + 1]), type(sys)(_m))
sys.modules[VLLM_WRAPPER].ncclUniqueId = NcclUniqueId


def rendezvous_state():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    state = dr._RendezvousState()
    now = datetime.datetime.now(datetime.timezone.utc) if hasattr(datetime, "UTC") else datetime.datetime.utcnow()
    for i in range(3):
        node = dr._NodeDesc(f"node-{i}", 1000 + i, 0)
        state.participants[node] = i
        state.last_heartbeats[node] = now
    state.wait_list.add(dr._NodeDesc("late", 7, 0))
    state.complete, state.deadline = True, now
    return state


def objects():
    import torch
    out = {"rendezvous_state": rendezvous_state()}
    for name in dir(torch):
        dt = getattr(torch, name)
        if isinstance(dt, torch.dtype):
            try:
                t = torch.zeros(3, dtype=dt)
            except Exception:  # dtypes without a CPU kernel for zeros (some float8 in old releases)
                t = None
            out[f"dtype_{name}"] = dt
            if t is not None:
                out[f"tensor_{name}"] = t
    out["tensor_strided_view"] = torch.arange(12.0).reshape(3, 4)[:, 1]
    out["parameter"] = torch.nn.Parameter(torch.ones(2))
    out["size"] = torch.Size([4, 4096])
    out["device"] = torch.device("cpu")
    out["pynccl_pipe_metadata"] = {"dtype": torch.bfloat16, "shape": torch.Size([2, 8])}
    out["nccl_unique_id"] = NcclUniqueId()
    out["containers"] = {"list": [1, 2.5, "x", b"y", None, True], "tuple": (1, (2,)), "set": {1, 2},
                         "frozenset": frozenset({3}), "bytearray": bytearray(b"ab"), "complex": 3 + 4j,
                         "big": 2 ** 70, "slice": slice(1, 5, 2), "range": range(3)}
    out["collections"] = [collections.OrderedDict(a=1), collections.Counter("aab"),
                          collections.defaultdict(list, a=[1]), collections.deque([1, 2])]
    now = datetime.datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=datetime.timezone.utc)
    out["datetimes"] = [now, now.date(), now.timetz(), datetime.timedelta(seconds=5), datetime.datetime(2026, 1, 1)]
    out["numbers"] = [decimal.Decimal("1.5"), fractions.Fraction(1, 3), uuid.UUID(int=7)]
    try:
        import numpy
        out["numpy"] = [numpy.arange(4, dtype=numpy.float32), numpy.float64(2.5), numpy.dtype("int16")]
    except ImportError:
        pass
    return out


def written():
    for name, obj in objects().items():
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            try:
                data = pickle.dumps(obj, protocol=proto)
            except Exception as e:  # noqa: some objects do not pickle at low protocols (ctypes needs 2+)
                print(json.dumps({"name": name, "protocol": proto, "error": repr(e)[:200]}), flush=True)
                continue
            r = Recorder(data)
            try:
                r.load()
                err = None
            except Exception as e:  # noqa: a few dtypes' tensors do not load back in some releases
                err = repr(e)[:200]
            print(json.dumps({"name": name, "protocol": proto, "value": data.hex(), "globals": sorted(set(r.seen)),
                              "load_error": err}), flush=True)


def call_pickle(module, qualname, arg="storeguard-census"):
    def short(s):
        b = s.encode("utf-8")
        return (b"\x8c" + bytes([len(b)]) + b) if len(b) < 256 else (b"X" + struct.pack("<I", len(b)) + b)
    return b"\x80\x04" + short(module) + short(qualname) + b"\x93" + short(arg) + b"\x85R."


def census(limit):
    import torch  # noqa: F401  what a reader of a torch job has loaded
    import torch.distributed  # noqa: F401
    n = 0
    for modname in sorted(sys.modules):
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        try:
            names = sorted(vars(mod))
        except TypeError:
            continue
        for name in names:
            try:
                obj = vars(mod)[name]
            except KeyError:
                continue
            if not callable(obj):
                continue
            print(json.dumps({"global": f"{modname}.{name}", "value": call_pickle(modname, name).hex()}))
            n += 1
            if limit and n >= limit:
                return


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["written", "census"])
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    written() if a.mode == "written" else census(a.limit)


if __name__ == "__main__":
    main()
