#!/usr/bin/env python3
"""Generates testdata/corpus/: pickles and, next to each, what CPython's unpickler does with it.

    python3 testdata/gen_corpus.py            # stdlib part, then the torch part in every torch
                                              # interpreter found (see TORCH_PYTHONS)
    python3 testdata/gen_corpus.py --torch    # only the torch part, in this interpreter
    python3 testdata/gen_corpus.py --no-torch # only the stdlib part

Each corpus item is NAME.pkl (raw pickle) or NAME.b64 (base64 text), and NAME.json, the oracle:

    encoding     "raw" or "base64"
    base64_ok    base64: whether base64.b64decode(text) returns (the rest is about its result)
    complete     whether loading returned (reached STOP)
    error        the exception loading raised, or null
    error_offset offset of the opcode that raised, when known (offset_unknown: why not)
    end          offset just past STOP, when complete
    protocol     the unpickler's protocol at the end (last PROTO executed), when known
    globals      [module, name] per find_class call, in order, after fix_imports as find_class
                 applies it (protocol < 3)
    calls        how many REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ and BUILD opcodes ran (when known)
    hostile      true: find_class returned a harmless stand-in; false: the real object
    mutation     true: a random mutation of another item; the test checks safety, not equality
    python, torch  the interpreter (and torch release) that made and loaded it

The oracle is pickle.loads itself, its find_class calls read from the "pickle.find_class" audit
event. A hostile pickle is loaded with a stand-in module for every import, so nothing it names
runs; a benign one with the real modules, so the file also proves the pickle loads.
"""
import argparse
import base64
import binascii
import builtins
import collections
import copyreg
import dataclasses
import datetime
import decimal
import fractions
import glob
import io
import json
import os
import pickle
import pickletools
import random
import subprocess
import sys
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")
sys.path.insert(0, HERE)

import corpus_classes as cc  # noqa: E402  (needs HERE on sys.path)

TORCH_PYTHONS = ["/usr/bin/python3"] + sorted(glob.glob("/var/cache/storeguard/torch/*/bin/python"))
PYVER = "%d.%d.%d" % sys.version_info[:3]
CALL_OPS = ("REDUCE", "NEWOBJ", "NEWOBJ_EX", "INST", "OBJ", "BUILD")


class _StandInMeta(type):
    def __setitem__(cls, key, value):
        pass

    def __getattr__(cls, name):
        return StandIn


class StandIn(metaclass=_StandInMeta):
    """What a hostile pickle's globals resolve to: accepts every use an unpickler makes."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return StandIn()

    def __setstate__(*args):
        pass

    def __getattr__(self, name):
        return StandIn

    def __setitem__(*args):
        pass

    def extend(*args):
        pass

    def append(*args):
        pass

    def add(*args):
        pass


class _Reader:
    """A file with read and readline only: the C unpickler then reads exactly what it consumes."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def read(self, n):
        r = self.data[self.pos:self.pos + n]
        self.pos += len(r)
        return r

    def readline(self):
        i = self.data.find(b"\n", self.pos)
        end = len(self.data) if i < 0 else i + 1
        r = self.data[self.pos:end]
        self.pos = end
        return r


def walk(data):
    """Opcodes as pickletools reads them: (start, name, arg, end); end None where it stopped."""
    f = io.BytesIO(data)
    ops = []
    while True:
        start = f.tell()
        c = f.read(1)
        if not c:
            break
        op = pickletools.code2op.get(c.decode("latin-1"))
        if op is None:
            ops.append((start, None, None, None))
            break
        try:
            arg = op.arg.reader(f) if op.arg is not None else None
        except Exception:
            ops.append((start, op.name, None, None))
            break
        ops.append((start, op.name, arg, f.tell()))
        if op.name == "STOP":
            break
    return ops


def _unpickler(base, hostile, record):
    class U(base):
        def find_class(self, module, name):
            record(module, name)
            if hostile:
                return StandIn
            return super().find_class(module, name)

        def persistent_load(self, pid):
            return StandIn()

    return U


def py_error_offset(data, hostile):
    """Where the pure-Python unpickler raises: the offset of the opcode it was running; None when
    it does not raise. (The C unpickler does not say; for the pickles here the two agree on
    whether they raise, which oracle() checks.)"""
    reader = _Reader(data)
    u = _unpickler(pickle._Unpickler, hostile, lambda m, n: None)(reader)
    offsets = []

    def pos():
        fr = u._unframer.current_frame
        if fr is None:
            return reader.pos
        return reader.pos - (len(fr.getbuffer()) - fr.tell())

    # pickle._Unpickler.load, with the offset of each opcode noted before it runs.
    u._unframer = pickle._Unframer(u._file_read, u._file_readline)
    u.read = u._unframer.read
    u.readinto = u._unframer.readinto
    u.readline = u._unframer.readline
    u.metastack = []
    u.stack = []
    u.append = u.stack.append
    u.proto = 0
    try:
        while True:
            offsets.append(pos())
            key = u.read(1)
            if not key:
                raise EOFError
            u.dispatch[key[0]](u)
    except pickle._Stop:
        return None
    except Exception:
        return offsets[-1]


def c_error_offset(data, ops, pos, error, hostile):
    """The offset of the opcode the C unpickler raised on, from how far it read (pos): reading a
    file with only read and readline, it reads what it consumes, except that a FRAME is read
    whole once the C code checked it is all there."""
    too_long = [o[0] for o in ops if o[1] == "FRAME" and o[3] is not None and o[2] > len(data) - o[3]]
    if any(o[1] == "FRAME" and o[0] < pos for o in ops):
        py = py_error_offset(data, hostile)
        if too_long and (py is None or py > too_long[0]):
            return too_long[0]
        return py
    if error.startswith("EOFError"):
        return pos  # "Ran out of input": no opcode byte left
    before = [o[0] for o in ops if o[0] < pos]
    return before[-1] if before else 0


_AUDIT = {"log": None}


def _audit(event, args):
    log = _AUDIT["log"]
    if log is not None and event == "pickle.find_class":
        log.append(("find_class",) + tuple(args))


sys.addaudithook(_audit)


class _FakeModule(types.ModuleType):
    def __getattr__(self, name):
        return StandIn


def loads(data, hostile):
    """pickle.loads(data) itself (the C unpickler reading a bytes buffer), with its find_class
    calls read from the "pickle.find_class" audit event (the names before fix_imports) and the
    import that follows each (the module after it). A hostile pickle's imports get a stand-in
    module for the duration, so nothing it names is imported or run."""
    log = []
    saved = {}
    real_import = builtins.__import__

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        log.append(("import", name))
        if not hostile:
            return real_import(name, globals, locals, fromlist, level)
        if name not in saved:
            saved[name] = sys.modules.get(name, _FakeModule)
        sys.modules[name] = _FakeModule(name)
        return sys.modules[name]

    error = None
    builtins.__import__ = imp
    _AUDIT["log"] = log
    try:
        pickle.loads(data)
    except BaseException as e:  # noqa: B902 - record whatever stops it
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        error = "%s: %s" % (type(e).__name__, str(e)[:200])
    finally:
        _AUDIT["log"] = None
        builtins.__import__ = real_import
        for name, m in saved.items():
            if m is _FakeModule:
                del sys.modules[name]
            else:
                sys.modules[name] = m
    import _compat_pickle as compat
    globs, raw = [], []
    for i, ev in enumerate(log):
        if ev[0] != "find_class":
            continue
        m, n = ev[1], ev[2]
        raw.append([m, n])
        imported = log[i + 1][1] if i + 1 < len(log) and log[i + 1][0] == "import" else None
        if (m, n) in compat.NAME_MAPPING and compat.NAME_MAPPING[(m, n)][0] == imported:
            globs.append(list(compat.NAME_MAPPING[(m, n)]))
        elif m in compat.IMPORT_MAPPING and compat.IMPORT_MAPPING[m] == imported:
            globs.append([imported, n])
        else:
            globs.append([m, n])
    return globs, raw, error


def oracle(data, hostile):
    globs, raw, error = loads(data, hostile)
    res = {"complete": error is None, "error": error, "hostile": hostile, "python": PYVER}
    if error and error.startswith("MemoryError"):
        res["safe_only"] = "MemoryError: how much memory Python gets is not the scanner's to know"
    res["globals"] = globs
    res["globals_hex"] = [[x.encode("utf-8", "surrogatepass").hex() for x in g] for g in globs]
    if raw != globs:
        res["raw_globals"] = raw
    # The same load from a file, to see how far the C unpickler read before it raised. It must
    # agree with pickle.loads: a file is read in pieces, and a line that straddles the end of a
    # FRAME is read differently (the C code drops the part in the frame).
    reader = _Reader(data)
    file_globs = []
    U = _unpickler(pickle.Unpickler, hostile, lambda m, n: file_globs.append([m, n]))
    file_error = None
    try:
        U(reader).load()
    except BaseException as e:  # noqa: B902
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        file_error = "%s: %s" % (type(e).__name__, str(e)[:200])
    ops = walk(data)
    if file_globs != raw or (file_error is None) != (error is None):
        res["offset_unknown"] = "reading from a file, the C unpickler did otherwise"
        return res
    if error is None:
        stop = [o for o in ops if o[1] == "STOP"]
        if not stop or stop[-1][3] is None:
            return res  # the walk disagrees with the C unpickler; leave the details out
        last = stop[-1][3]
        executed = [o for o in ops if o[3] is not None and o[3] <= last]
        res["end"] = last
    else:
        off = c_error_offset(data, ops, reader.pos, file_error, hostile)
        if off is None:
            res["offset_unknown"] = "the pure-Python unpickler does not raise"
            return res
        res["error_offset"] = off
        if not (any(o[0] == off for o in ops) or off >= len(data)):
            return res  # the walk stopped before the failing opcode: no counts
        executed = [o for o in ops if o[0] < off and o[3] is not None]
    counts = collections.Counter(o[1] for o in executed if o[1] in CALL_OPS)
    res["calls"] = {k: counts.get(k, 0) for k in CALL_OPS}
    proto = 0
    for o in executed:
        if o[1] == "PROTO" and isinstance(o[2], int) and o[2] <= 5:
            proto = o[2]
    res["protocol"] = proto
    return res


WRITTEN = []


def emit(name, data, hostile, **extra):
    assert "/" not in name and name not in WRITTEN, name
    WRITTEN.append(name)
    res = {"encoding": "raw"}
    res.update(oracle(data, hostile))
    res.update(extra)
    with open(os.path.join(OUT, name + ".pkl"), "wb") as f:
        f.write(data)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")


def emit_b64(name, text, hostile, **extra):
    assert "/" not in name and name not in WRITTEN, name
    WRITTEN.append(name)
    res = {"encoding": "base64"}
    try:
        data = base64.b64decode(text)
        res["base64_ok"] = True
        res.update(oracle(data, hostile))
    except binascii.Error as e:
        res["base64_ok"] = False
        res["error"] = "binascii.Error: %s" % e
        res["python"] = PYVER
        res["hostile"] = hostile
    res.update(extra)
    with open(os.path.join(OUT, name + ".b64"), "wb") as f:
        f.write(text)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Benign values, every protocol.


def benign_values():
    rec_list = []
    rec_list.append(rec_list)
    rec_dict = {}
    rec_dict["self"] = rec_dict
    shared = [1, "x"]
    p = cc.Point(1, 2.5, ["a"])
    return {
        "int_small": [0, 1, -1, 255, 256, 65535, 65536],
        "int_edges": [2**31 - 1, -2**31, 2**31, 2**63, -2**63 - 1, 2**64],
        "int_big": [2**1000, -3**500],
        "bool_none": [True, False, None],
        "float": [0.0, -1.5, 1e300, 5e-324, float("inf"), float("-inf")],
        "float_nan": float("nan"),
        "complex": complex(1, -2),
        "str_empty": "",
        "str_ascii": "hello world",
        "str_unicode": "h\u00e9llo \u4e16\u754c \U0001f600",
        "str_escapes": "back\\slash 'q' \"dq\" \n\r\t\x00\x1a end",
        "str_surrogate": "lone \ud800 surrogate",
        "str_long": "x" * 2000,
        "bytes_empty": b"",
        "bytes_small": b"\x00\x01\xfe\xff",
        "bytes_300": bytes(range(256)) + bytes(44),
        "bytearray": bytearray(b"abc\x00"),
        "list_empty": [],
        "list_small": [1, "two", 3.0, None],
        "list_2000": list(range(2000)),
        "dict_empty": {},
        "dict_small": {"a": 1, "b": [2], 3: "c"},
        "dict_1500": {"k%d" % i: i for i in range(1500)},
        "set_empty": set(),
        "set_small": {1, 2, 3},
        "set_1200": set(range(1200)),
        "frozenset_empty": frozenset(),
        "frozenset_small": frozenset({1, 2}),
        "tuples": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((1,), [2], {3: 4})],
        "nested": {"a": [{"b": ({1, 2}, frozenset({3}))}], "c": (("d",),)},
        "recursive_list": rec_list,
        "recursive_dict": rec_dict,
        "shared": [shared, shared, (shared,)],
        "dataclass": p,
        "dataclass_frozen": cc.NodeDesc("node0.example.com", 4242, 0),
        "dataclass_in_dict": {cc.NodeDesc("n1", 1, 0): 0, cc.NodeDesc("n2", 2, 1): 1},
        "namedtuple": cc.Pair(1, "r"),
        "enum": [cc.Color.RED, cc.Color.GREEN, cc.Level.HIGH],
        "datetime_naive": datetime.datetime(2026, 1, 2, 3, 4, 5, 678901),
        "datetime_utc": datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.timezone.utc),
        "datetime_offset": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=-5), "EST")),
        "date_time_delta": [datetime.date(2026, 11, 26), datetime.time(12, 30), datetime.timedelta(days=1, seconds=2)],
        "decimal_fraction": [decimal.Decimal("1.10"), fractions.Fraction(3, 4)],
        "ordereddict": collections.OrderedDict([("z", 1), ("a", 2)]),
        "defaultdict": collections.defaultdict(list, {"k": [1]}),
        "deque_counter": [collections.deque([1, 2], maxlen=5), collections.Counter("aab")],
        "range_slice": [range(1, 10, 2), slice(1, None, 3)],
        "types": [int, list, cc.Point, len],
        "plain_object": cc.Plain(),
        "slots_object": cc.Slotted(),
        "getstate_setstate": cc.WithState(7),
        "reduce": cc.WithReduce(1, [2]),
        "reduce_ex": cc.WithReduceEx("v"),
        "newargs_ex": cc.WithNewArgs(1, b=2),
        "old_style_object": cc.OldStyle(),
        "list_subclass": cc.ListSub([1, 2]),
        "dict_subclass": cc.DictSub(a=1),
        "nested_class": cc.Outer.Inner(),
        "nested_class_type": cc.Outer.Inner.Deepest,
    }


def gen_benign():
    for name, value in benign_values().items():
        for proto in range(6):
            try:
                data = pickle.dumps(value, protocol=proto)
            except Exception as e:
                print("skip %s p%d: %s" % (name, proto, e), file=sys.stderr)
                continue
            emit("benign_%s_p%d" % (name, proto), data, False)
    big = bytes(70000)
    for proto in (3, 4, 5):
        emit("benign_bytes_70000_p%d" % proto, pickle.dumps([big, "after"], protocol=proto), False)
    # Protocol 5 buffers: in band, and out of band (pickle.loads without buffers raises).
    for ro in (True, False):
        obj = pickle.PickleBuffer(b"abcdef" if ro else bytearray(b"abcdef"))
        kind = "readonly" if ro else "writable"
        emit("benign_picklebuffer_inband_%s_p5" % kind, pickle.dumps(obj, protocol=5), False)
        emit("benign_picklebuffer_outofband_%s_p5" % kind,
             pickle.dumps([1, obj], protocol=5, buffer_callback=lambda b: False), False)
    # Pickler.fast (no memo) and a pickle made by the pure-Python pickler.
    f = io.BytesIO()
    pk = pickle.Pickler(f, protocol=2)
    pk.fast = True
    pk.dump({"a": [1, 2], "b": cc.Plain()})
    emit("benign_fast_mode_p2", f.getvalue(), False)
    f = io.BytesIO()
    pickle._Pickler(f, protocol=4).dump({"a": cc.Point(1, 2.0)})
    emit("benign_pure_python_pickler_p4", f.getvalue(), False)
    emit("benign_optimized_p4", pickletools.optimize(pickle.dumps([cc.Point(1, 2.0)] * 3, protocol=4)), False)
    emit_b64("benign_b64_dict_p4", base64.b64encode(pickle.dumps({"a": [1, "b"]}, protocol=4)), False)
    emit_b64("benign_b64_point_p2", base64.b64encode(pickle.dumps(cc.Point(1, 2.0), protocol=2)), False)
    # About 4 KiB of what a rendezvous-like value holds, for the benchmark.
    nodes = [cc.NodeDesc("node%02d.cluster.example.com" % i, 10000 + i, i % 3) for i in range(52)]
    mix = {
        "round": 7,
        "participants": {n: i for i, n in enumerate(nodes[:44])},
        "wait_list": set(nodes[44:]),
        "last_heartbeats": {n: datetime.datetime(2026, 11, 26, 5, 0, i % 60) for i, n in enumerate(nodes)},
        "config": {"min_nodes": 2, "max_nodes": 32, "timeouts": [30.0, 60.0, 600.0], "name": "job-1"},
    }
    emit("benign_mix_4k_p4", pickle.dumps(mix, protocol=4), False)
    # The data after STOP is not read.
    emit("benign_trailing_garbage_p2", pickle.dumps([1], protocol=2) + b"\xff\xff garbage", False)


# ---------------------------------------------------------------------------------------------
# Hostile pickles: made by hand, or by an object whose __reduce__ names something dangerous.


class ReduceTo:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def gen_hostile():
    import subprocess as sp
    cases = {
        "os_system": ReduceTo(os.system, ("echo pwned",)),
        "eval": ReduceTo(eval, ("__import__('os').system('id')",)),
        "exec": ReduceTo(exec, ("import os",)),
        "popen": ReduceTo(sp.Popen, (["echo", "pwned"],)),
        "check_output": ReduceTo(sp.check_output, (["id"],)),
        "getattr": ReduceTo(getattr, (ReduceTo(__import__, ("os",)), "system")),
        "import": ReduceTo(__import__, ("os",)),
        "nested_attr": ReduceTo(os.path.join, ("a", "b")),
    }
    for name, obj in cases.items():
        for proto in range(6):
            emit("hostile_%s_p%d" % (name, proto), pickle.dumps(obj, protocol=proto), True)
    # A list with a hostile element deep inside, and a hostile BUILD state.
    emit("hostile_inside_list_p4", pickle.dumps([1, {"k": (cases["os_system"],)}], protocol=4), True)

    H = {
        # GLOBAL + REDUCE, protocol 0 text.
        "global_reduce": b"cos\nsystem\n(S'echo pwned'\ntR.",
        # STACK_GLOBAL from two strings.
        "stack_global": b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x0aecho pwned\x94\x85\x94R\x94.",
        # INST: import and call in one opcode.
        "inst": b"(S'echo pwned'\nios\nsystem\n.",
        # OBJ: the class is the item after the mark.
        "obj": b"(cos\nsystem\nS'echo pwned'\no.",
        # builtins.eval through the protocol 2 spelling.
        "builtins_eval": b"\x80\x02cbuiltins\neval\nX\x02\x00\x00\x001+q\x00\x85q\x01Rq\x02.",
        # getattr(__import__('os'), 'system')('id')
        "getattr_chain": (b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\nX\x02\x00\x00\x00os\x85R"
                          b"X\x06\x00\x00\x00system\x86RX\x02\x00\x00\x00id\x85R."),
        # __builtin__ is Python 2's name: fix_imports maps it to builtins below protocol 3.
        "py2_builtin_eval_p0": b"c__builtin__\neval\n(S'1'\ntR.",
        "py2_builtin_eval_p2": b"\x80\x02c__builtin__\neval\nX\x01\x00\x00\x001\x85R.",
        "py2_builtin_xrange_p2": b"\x80\x02c__builtin__\nxrange\nK\x03\x85R.",
        "py2_exceptions_p2": b"\x80\x02cexceptions\nOSError\n)R.",
        "py2_copy_reg_p1": b"ccopy_reg\n_reconstructor\n(c__builtin__\nobject\ng1\nNtR.",
        # Same spelling in protocol 4: no mapping any more.
        "py2_builtin_eval_p4": b"\x80\x04c__builtin__\neval\n\x8c\x011\x85R.",
        # PROTO 2 after a protocol 0 start, and back: the mapping follows the current protocol.
        "proto_switch": b"c__builtin__\nopen\n\x80\x04c__builtin__\nopen\n\x80\x02c__builtin__\nopen\n000N.",
        # The import runs, then the garbage raises: the import is still reported.
        "import_then_garbage": b"cos\nsystem\n\xff",
        "stack_global_then_garbage": b"\x80\x04\x8c\x02os\x8c\x06system\x93\x00",
        "import_then_truncated": b"\x80\x02cos\nsystem\nX\x10\x00\x00\x00short",
        # STACK_GLOBAL whose strings come from the memo.
        "memo_stack_global": b"\x80\x04\x8c\x02os\x94\x8c\x01x\x94\x8c\x06system\x94h\x00h\x02\x93)R.",
        "binget_module": b"\x80\x04\x8c\x02osq\x070\x8c\x05posixq\x080h\x07\x8c\x06system\x93h\x08\x8c\x06system\x93\x86.",
        "long_binget_module": b"\x80\x04\x8c\x02osr\x00\x01\x00\x000j\x00\x01\x00\x00\x8c\x06system\x93.",
        "get_text_module": b"Vos\np12\n0g12\nVsystem\n\x93.",
        "dup_module": b"\x80\x04\x8c\x02os2\x8c\x06system\x93\x86.",
        # STACK_GLOBAL on values that are not str: Python raises, nothing is imported.
        "stack_global_int": b"\x80\x04K\x01\x8c\x06system\x93.",
        "stack_global_bytes": b"\x80\x04C\x02os\x8c\x06system\x93.",
        "stack_global_tuple": b"\x80\x04\x8c\x02os\x85\x8c\x06system\x93.",
        "stack_global_underflow": b"\x80\x04\x8c\x06system\x93.",
        # A module name built by a call: unknown to a scanner, os.system to Python.
        "stack_global_from_call": b"\x80\x04cbuiltins\nstr\n\x8c\x02os\x85R\x8c\x06system\x93\x8c\x02id\x85R.",
        # Text str spellings of the module name.
        "stack_global_unicode_escape": b"V\\u006fs\nVsystem\n\x93.",
        "stack_global_string_escape": b"\x80\x02S'\\x6fs'\nS'sys\\164em'\n\x93.",
        "stack_global_binstring": b"\x80\x02U\x02osT\x06\x00\x00\x00system\x93.",
        # Dotted names are attribute paths from protocol 4 on.
        "dotted_p4": b"\x80\x04\x8c\x08builtins\x8c\x17getattr.__self__.exec\x93.",
        "dotted_global_p0": b"cos\npath.join\n.",
        # A mark the unpickler never closes, then an import.
        "unclosed_mark": b"((cos\nsystem\n.",
        # INST without a mark raises before it reads the names.
        "inst_no_mark": b"ios\nsystem\n.",
        # BUILD on a module object sets its attributes.
        "build_module": b"cos\npath\n}S'sep'\nS'!'\nsb.",
        # SETITEM on a global.
        "setitem_global": b"cos\nenviron\nS'LD_PRELOAD'\nS'/tmp/x.so'\ns.",
        # APPEND to a global list.
        "append_global": b"csys\npath\nS'/tmp'\na.",
        # A persistent id: pickle.loads has no persistent_load and raises; an unpickler that has one
        # calls it.
        "persid": b"P0\n.",
        "binpersid": b"\x80\x02K\x01Q.",
        # Two pickles back to back: loads stops after the first.
        "two_pickles": b"\x80\x02N.cos\nsystem\n.",
        # A FRAME that claims more than there is: raises before reading inside it.
        "frame_too_long": b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",
        "frame_ok_unbounded_ops": b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",
        # NEXT_BUFFER with no buffers.
        "next_buffer": b"\x80\x05\x97.",
        "protocol_6": b"\x80\x06N.",
    }
    for name, data in H.items():
        extra = {}
        if name in ("persid", "binpersid"):
            extra["safe_only"] = "pickle.loads has no persistent_load and raises; the scan goes on (Report.Persistent)"
        if name == "stack_global_from_call":
            extra["safe_only"] = "the oracle's stand-in for str returns no str; the real str would"
        emit("hostile_" + name, data, True, **extra)
    os_system = pickle.dumps(cases["os_system"], protocol=4)
    text = base64.b64encode(os_system)
    emit_b64("hostile_b64_os_system", text, True)
    emit_b64("hostile_b64_newlines", base64.encodebytes(os_system), True)
    emit_b64("hostile_b64_junk", b"!".join(text[i:i + 3] for i in range(0, len(text), 3)), True)
    emit_b64("hostile_b64_bad_padding", text.rstrip(b"=") + b"A", True)
    emit_b64("hostile_b64_extra_char", text + b"A", True)
    emit_b64("hostile_b64_after_padding", base64.b64encode(os_system[:-1]) + b"=" + base64.b64encode(b"garbage"), True)
    emit_b64("hostile_b64_urlsafe", base64.urlsafe_b64encode(os_system), True)


# ---------------------------------------------------------------------------------------------
# Text argument edge cases: each line under each text opcode, loaded by Python.

NUMBER_LINES = [
    b"0", b"1", b"-1", b"+1", b" 1", b"1 ", b"\t1\t", b"01", b"010", b"08", b"00", b"0x1f", b"0X1F",
    b"0x", b"0x_1f", b"0o17", b"0O17", b"0b101", b"0b", b"0b2", b"1_000", b"1__0", b"_1", b"1_",
    b"0_0", b"0_7", b"99999999999999999999", b"-9223372036854775808", b"9223372036854775807",
    b"9223372036854775808", b"0777777777777777777777777", b"-0x8000000000000000", b"\x00",
    b"1\x00x", b" \x00", b"+\x00", b"--1", b"1.0", b" ", b"1L", b"L", b"0L", b"1LL", b"-L",
    "\u0661".encode(), b"\x0b1", b"\x1c1", b"inf", b"-Infinity", b"NaN", b"nan(1)", b"infinit",
    b"1e5", b"1E-5", b"1e", b"1e+", b".5", b"5.", b".", b"-.5e-3", b"1e500", b"-1e500", b"1e-500",
    b"1.7976931348623157e308", b"1.7976931348623158e308", b"1.7976931348623159e308",
    str(2**1024 - 2**970).encode(), str(2**1024 - 2**970 - 1).encode(),
    b"0." + b"0" * 400 + b"1e700", b"1" * 320 + b".5",
    b"1e0000000000000000000000001", b"0e99999999999999", b"1\r", b"0x10L", b"0o7L", b"12_3L",
]

STRING_LINES = [
    b"'abc'", b'"abc"', b"'abc\"", b"'", b"''", b"abc", b"'a\\'", b"'\\x41'", b"'\\x4'",
    b"'\\x4g'", b"'\\101'", b"'\\777'", b"'\\400'", b"'\\q'", b"'\\n'", "'\u00e9'".encode(),
    b"'\\\\'", b"' os '", b"'\\0'", b"'\\08'", b"'\\x'", b"'\\\"'", b"\"'\"", b"'\\\n'",
]

UNICODE_LINES = [
    b"os", b"o\\u0073", b"\\u006fs", b"\\U0000006fs", b"\\u006", b"\\u00zz", b"\\U00110000",
    b"\\", b"a\\", b"\\\\u0041", b"\\x41", "\u00e9".encode("latin-1"), b"\\ud800", b"",
    b"\\U0001F600", b"\\u", b"\\U0010ffff", b"o\\s",
]

NAME_LINES = [
    b"os", b"", b"os ", b"os\r", "\u00f6s".encode(), b"\xff", b"\xed\xa0\x80", b"\xc0\xaf",
    b"\xe0\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xe2\x82", b"o\x00s",
    b"a" * 1100, b"os.path",
]


def gen_edges():
    for i, line in enumerate(NUMBER_LINES):
        emit("edge_int_%02d" % i, b"I" + line + b"\n.", True, line=line.decode("latin-1"))
        emit("edge_long_%02d" % i, b"L" + line + b"\n.", True, line=line.decode("latin-1"))
        extra = {}
        if line == b"1.7976931348623159e308":
            # dtoa raises OverflowError for some literals below 2**1024 and not for others; the
            # scanner raises only from 1e309 on, where every Python does.
            extra["safe_only"] = "float overflow between the largest double and 1e309"
        emit("edge_float_%02d" % i, b"F" + line + b"\n.", True, line=line.decode("latin-1"), **extra)
        emit("edge_put_%02d" % i, b"Np" + line + b"\n.", True, line=line.decode("latin-1"))
        emit("edge_get_%02d" % i, b"Np0\n0Np1\n0Np8\n0Np10\n0g" + line + b"\n.", True, line=line.decode("latin-1"))
    for i, line in enumerate(STRING_LINES):
        emit("edge_string_%02d" % i, b"S" + line + b"\nS'x'\n\x93.", True, line=line.decode("latin-1"))
    for i, line in enumerate(UNICODE_LINES):
        emit("edge_unicode_%02d" % i, b"V" + line + b"\nVx\n\x93.", True, line=line.decode("latin-1"))
    for i, line in enumerate(NAME_LINES):
        emit("edge_global_module_%02d" % i, b"c" + line + b"\nx\n.", True)
        emit("edge_global_name_%02d" % i, b"cm\n" + line + b"\n.", True)
        emit("edge_inst_%02d" % i, b"(i" + line + b"\nx\n.", True)
    binunicode = [b"os", b"\xed\xa0\x80", b"\xed\xa0", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98\x80", b"\xff",
                  b"\xe0\x80\x80", b"\xe0\xa0\x80", b"\xf0\x80\x80\x80", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf",
                  b"\xed\x9f\xbf", b"\xed\xbf\xbf", b"\xee\x80\x80", b"\xe2\x82", b"\xc2", b"\xc2\x80", b"\xdf\xbf",
                  b"\x80", b"a\xf5\x80\x80\x80", b"\xed\xb0\x80\xed\xa0\x80"]
    for i, s in enumerate(binunicode):
        emit("edge_binunicode_%02d" % i, b"\x80\x04\x8c" + bytes([len(s)]) + s + b"\x8c\x01x\x93.", True)
        emit("edge_binstring_%02d" % i, b"\x80\x02U" + bytes([len(s)]) + s + b"U\x01x\x93.", True)
    struct = {
        "empty": b"",
        "stop_empty": b".",
        "pop_mark": b"(N1N.",
        "pop_pops_mark": b"N(0.",
        "pop_underflow": b"0.",
        "pop_mark_no_mark": b"1N.",
        "dup_after_mark": b"N(2.",
        "tuple1_over_mark": b"N(\x85.",
        "tuple_below_mark": b"N(N\x86.",
        "append_over_mark": b"](Na.",
        "appends_empty": b"](e.",
        "appends_to_tuple": b")(Ne.",
        "appends_to_dict": b"}(Ne.",
        "appends_to_bytearray": b"\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x00(K\x01e.",
        "setitem_list": b"]K\x00K\x01s.",
        "setitem_tuple": b")NNs.",
        "setitems_odd": b"}(NNNu.",
        "setitems_unhashable": b"}(]Nu.",
        "dict_unhashable": b"(}Nd.",
        "dict_odd": b"(NNNd.",
        "dict_tuple_key_unhashable": b"(](\x85Nd.",
        "additems_to_list": b"\x80\x04](N\x90.",
        "additems_unhashable": b"\x80\x04\x8f(]\x90.",
        "frozenset_unhashable": b"\x80\x04(]\x91.",
        "reduce_not_tuple": b"cm\nf\nNR.",
        "reduce_int_callable": b"K\x01)R.",
        "newobj_not_type": b"\x80\x02K\x01)\x81.",
        "newobj_args_list": b"\x80\x02cm\nC\n]\x81.",
        "newobj_ex_kwargs_list": b"\x80\x04cm\nC\n)]\x92.",
        "newobj_ex_ok": b"\x80\x04cm\nC\n)}\x92.",
        "obj_no_class": b"(o.",
        "obj_int_class": b"(K\x01o.",
        "build_underflow": b"Nb.",
        "build_literal": b"]Nb.",
        "memoize_empty": b"\x94.",
        "memoize_after_put": b"Np5\n\x94\x30h\x01.",
        "binget_missing": b"h\x05.",
        "binput_over_mark": b"N(q\x00.",
        "long_binput_big": b"Nr\xff\xff\xff\x7fj\xff\xff\xff\x7f.",
        "readonly_buffer_str": b"\x80\x05\x8c\x01a\x98.",
        "readonly_buffer_bytes": b"\x80\x05C\x01a\x98.",
        "readonly_buffer_bytearray": b"\x80\x05\x96\x01\x00\x00\x00\x00\x00\x00\x00a\x98.",
        "long1_ok": b"\x8a\x02\x01\x80.",
        "long4_negative": b"\x8b\xff\xff\xff\xff.",
        "long4_truncated": b"\x8b\x10\x00\x00\x00ab.",
        "binbytes8_huge": b"\x8e\xff\xff\xff\xff\xff\xff\xff\x7f.",
        "binbytes8_overflow": b"\x8e\xff\xff\xff\xff\xff\xff\xff\xff.",
        "ext1_zero": b"\x82\x00.",
        "frame_overflow": b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff.",
        "unknown_opcode": b"\xff",
        "unknown_printable": b"z",
        "stop_only_mark": b"(.",
        "inst_int_then": b"(K\x01ibuiltins\nint\n.",
        "global_empty_name": b"cos\n\n.",
        "global_truncated_name": b"cos\nsys",
        "string_truncated": b"S'abc'",
        "two_marks_pop": b"((00N.",
    }
    for name, data in struct.items():
        extra = {}
        if name == "setitem_list":
            extra["safe_only"] = "list index range: the scanner does not track list lengths"
        emit("edge_" + name, data, True, **extra)


# ---------------------------------------------------------------------------------------------
# Random mutations of the items above, to check that the scanner never stops before Python does.


def gen_mutations(n, seed):
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    rng = random.Random(seed)
    bases = []
    for name in WRITTEN:
        path = os.path.join(OUT, name + ".pkl")
        if os.path.exists(path) and os.path.getsize(path) < 600:
            bases.append(open(path, "rb").read())
    opcodes = [bytes([c]) for c in b"(.012FIJKLMNPQRSTUVXabcdeghijlmopqrstu})]G" + bytes(range(0x80, 0x99))]
    for i in range(n):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            pos = rng.randrange(len(data) + 1)
            if r < 0.3 and data:
                data[min(pos, len(data) - 1)] = rng.randrange(256)
            elif r < 0.55:
                data[pos:pos] = rng.choice(opcodes)
            elif r < 0.75 and data:
                del data[pos:pos + rng.randint(1, 4)]
            elif r < 0.9:
                other = rng.choice(bases)
                a = rng.randrange(len(other) + 1)
                data[pos:pos] = other[a:a + rng.randint(1, 12)]
            else:
                del data[pos:]
        emit("mutation_%03d" % i, bytes(data), True, mutation=True)


# ---------------------------------------------------------------------------------------------
# torch: a tensor, and the torchrun rendezvous state exactly as C10dRendezvousBackend stores it.


class FakeStore:
    """What C10dRendezvousBackend calls on its TCPStore; records the values it would send."""

    def __init__(self):
        self.kv = {}
        self.sent = []

    @staticmethod
    def _b(v):
        return v.encode() if isinstance(v, str) else bytes(v)

    def compare_set(self, key, expected, desired):
        expected, desired = self._b(expected), self._b(desired)
        cur = self.kv.get(key)
        if (cur is None and expected == b"") or cur == expected:
            self.kv[key] = desired
            self.sent.append(desired)
        return self.kv.get(key, expected)

    def get(self, key):
        return self.kv[key]


def gen_torch():
    import inspect

    import torch
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    tv = torch.__version__.split("+")[0]
    tag = "torch-%s" % tv
    extra = {"torch": torch.__version__}
    for proto in (2, 4):
        emit("%s_tensor_p%d" % (tag, proto), pickle.dumps(torch.ones(3), protocol=proto), False, **extra)
    emit("%s_tensor_default" % tag, pickle.dumps(torch.arange(4, dtype=torch.float64)), False, **extra)

    src = inspect.getsource(dr)
    aware = "datetime.now(timezone.utc)" in src

    def when(sec):
        t = datetime.datetime(2026, 11, 26, 5, 30, sec, 123456)
        return t.replace(tzinfo=datetime.timezone.utc) if aware else t

    settings_fields = {
        "run_id": "storeguard-corpus", "min_nodes": 1, "max_nodes": 4,
        "timeout": dr.RendezvousTimeout(), "keep_alive_interval": datetime.timedelta(seconds=5),
        "keep_alive_max_attempt": 3, "cas_backoff_max_seconds": 0.0,
    }
    params = inspect.signature(dr.RendezvousSettings).parameters
    settings = dr.RendezvousSettings(**{k: v for k, v in settings_fields.items() if k in params})

    store = FakeStore()
    backend = c10d.C10dRendezvousBackend(store, settings.run_id)
    holder = dr._BackendRendezvousStateHolder(backend, settings)

    def send(name):
        holder.mark_dirty()
        holder.sync()
        text = store.sent[-1]
        emit_b64("%s_rdzv_state_%s_b64" % (tag, name), text, False, **extra)
        emit("%s_rdzv_state_%s" % (tag, name), base64.b64decode(text), False, **extra)

    send("initial")
    nodes = [dr._NodeDesc("node%d.cluster.example" % i, 4000 + i, i % 2) for i in range(4)]
    st = holder.state
    st.round = 3
    st.participants = {nodes[0]: 0, nodes[1]: 1}
    st.wait_list = {nodes[2]}
    if hasattr(st, "redundancy_list"):
        st.redundancy_list = {nodes[3]}
    st.last_heartbeats = {n: when(i) for i, n in enumerate(nodes)}
    st.deadline = when(59)
    send("joining")
    st.complete = True
    st.deadline = None
    send("complete")
    st.closed = True
    send("closed")


def write_fuzz_seeds():
    """testdata/fuzz/FuzzScan: the corpus items of at most 4 KiB, except mutations and all but
    three protocols of the benign values, in the Go fuzzing corpus format."""
    d = os.path.join(HERE, "fuzz", "FuzzScan")
    os.makedirs(d, exist_ok=True)
    for f in glob.glob(os.path.join(d, "*")):
        os.remove(f)
    for path in sorted(glob.glob(os.path.join(OUT, "*.pkl")) + glob.glob(os.path.join(OUT, "*.b64"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name.startswith("mutation_") or (name.startswith("benign_") and name[-3:] not in ("_p0", "_p2", "_p5")):
            continue
        data = open(path, "rb").read()
        if len(data) > 4096:
            continue
        lit = "".join(chr(b) if 0x20 <= b < 0x7f and b not in b'"\\' else "\\x%02x" % b for b in data)
        suffix = "_b64" if path.endswith(".b64") and not name.endswith("_b64") else ""
        with open(os.path.join(d, name + suffix), "w") as f:
            f.write('go test fuzz v1\n[]byte("%s")\n' % lit)


def main():
    # Escapes like '\\q' in STRING arguments warn; they are there on purpose.
    warnings.simplefilter("ignore", DeprecationWarning)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Set and dict-key order of str depends on the hash seed; fix it so reruns are identical.
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", action="store_true", help="only the torch part, in this interpreter")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--mutations", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261126)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.torch:
        gen_torch()
        return
    for f in glob.glob(os.path.join(OUT, "*")):
        if not os.path.basename(f).startswith("torch-"):
            os.remove(f)
    gen_benign()
    gen_hostile()
    gen_edges()
    if not args.no_torch:
        for f in glob.glob(os.path.join(OUT, "torch-*")):
            os.remove(f)
        for py in TORCH_PYTHONS:
            if not os.path.exists(py):
                continue
            has = subprocess.run([py, "-c", "import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"],
                                 capture_output=True).returncode == 0
            if not has:
                print("no torch rendezvous in %s" % py, file=sys.stderr)
                continue
            print("torch part with %s" % py, file=sys.stderr)
            subprocess.run([py, os.path.abspath(__file__), "--torch"], check=True)
    gen_mutations(args.mutations, args.seed)
    write_fuzz_seeds()


if __name__ == "__main__":
    main()
