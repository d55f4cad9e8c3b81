#!/usr/bin/env python3
"""Reference parser for the golden captures (no torch needed).

Parses every protocol/testdata/golden/*/conn*.c2s with the opcode table of the
manifest's generation, checks that each API call's byte range holds whole
messages, and prints per capture: handshake, the ops each API call sent.
Exit 1 on any parse error or unexpected call error.

  python3 interop/golden_check.py [GOLDEN_DIR] [--table]   (--table: opcode per API per version)
"""
import json
import os
import struct
import sys

NAMES_G0 = ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "WATCH_KEY", "DELETE_KEY"]
NAMES_G1 = ["SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT", "GETNUMKEYS", "DELETE_KEY", "APPEND",
            "MULTI_GET", "MULTI_SET", "CANCEL_WAIT"]
NAMES_G2 = ["VALIDATE"] + NAMES_G1
EXTRA = {"G3": ["PING"], "G4": ["PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN"],
         "G5": ["PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS"],
         "G6": ["PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS", "BARRIER"]}


def table(gen):
    if gen == "G0":
        return NAMES_G0
    if gen == "G1":
        return NAMES_G1
    return NAMES_G2 + EXTRA.get(gen, [])


# layouts: sequence of fields; "str" = u64 len + bytes, "u32", "i64", "list" = u64 n + n*str, "pairs"
LAYOUT = {
    "VALIDATE": ["u32"], "PING": ["u32"], "SET": ["str", "str"], "APPEND": ["str", "str"],
    "QUEUE_PUSH": ["str", "str"], "COMPARE_SET": ["str", "str", "str"], "GET": ["str"],
    "DELETE_KEY": ["str"], "QUEUE_POP": ["str"], "QUEUE_LEN": ["str"], "WATCH_KEY": ["str"],
    "ADD": ["str", "i64"], "BARRIER": ["str", "i64"], "CHECK": ["list"], "WAIT": ["list"],
    "MULTI_GET": ["list"], "MULTI_SET": ["pairs"], "GETNUMKEYS": [], "CANCEL_WAIT": [], "LIST_KEYS": [],
}


class Short(Exception):
    pass


def parse_one(buf, off, names):
    if off >= len(buf):
        raise Short()
    op = buf[off]
    if op >= len(names):
        raise ValueError(f"unknown opcode 0x{op:02x} at {off}")
    name = names[op]
    p = off + 1

    def need(n):
        if p + n > len(buf):
            raise Short()

    def rd_str():
        nonlocal p
        need(8)
        (n,) = struct.unpack_from("<Q", buf, p)
        p += 8
        need(n)
        s = bytes(buf[p:p + n])
        p += n
        return s

    fields = []
    for f in LAYOUT[name]:
        if f == "u32":
            need(4)
            fields.append(struct.unpack_from("<I", buf, p)[0])
            p += 4
        elif f == "i64":
            need(8)
            fields.append(struct.unpack_from("<q", buf, p)[0])
            p += 8
        elif f == "str":
            fields.append(rd_str())
        elif f == "list":
            need(8)
            (n,) = struct.unpack_from("<Q", buf, p)
            p += 8
            fields.append([rd_str() for _ in range(n)])
        elif f == "pairs":
            need(8)
            (n,) = struct.unpack_from("<Q", buf, p)
            p += 8
            fields.append([(rd_str(), rd_str()) for _ in range(n)])
    return name, fields, p


def parse_stream(buf, names):
    msgs, off = [], 0
    while off < len(buf):
        name, fields, end = parse_one(buf, off, names)
        msgs.append((off, end, name, fields))
        off = end
    return msgs


def check_dir(d, quiet=False):
    m = json.load(open(os.path.join(d, "manifest.json")))
    names = table(m["generation"])
    errors = []
    per_api = {}
    hs = set()
    for c in m["connections"]:
        buf = open(os.path.join(d, c["file"]), "rb").read()
        try:
            msgs = parse_stream(buf, names)
        except (ValueError, Short) as e:
            errors.append(f"{c['file']}: {type(e).__name__} {e}")
            continue
        bounds = {s for s, _, _, _ in msgs} | {len(buf)}
        for call in c["calls"]:
            if call.get("unexpected_error"):
                errors.append(f"{c['file']} {call['api']}: {call.get('error')}")
            s, e = call["c2s_start"], call["c2s_end"]
            if s not in bounds or e not in bounds:
                errors.append(f"{c['file']} {call['api']} range {s}-{e} splits a message")
                continue
            ops = [n for (ms, me, n, _) in msgs if s <= ms < e]
            if call["api"] in ("TCPStore()", "clone()"):
                hs.add(" ".join(ops) or "(nothing)")
            else:
                key = call["api"] + ("(timeout)" if call["api"] == "wait" and call.get("error") else "")
                if call.get("wire") is False:
                    ops = ["(client-side: " + (call.get("error") or "")[:40] + ")"]
                per_api.setdefault(key, set()).add(" + ".join(ops) if ops else "(nothing)")
    if not quiet:
        print(f"== {os.path.basename(d)}  gen={m['generation']}  libuv={m.get('libuvBackend_property')}  "
              f"conns={len(m['connections'])}  handshake={sorted(hs)}")
        for api, ops in per_api.items():
            print(f"   {api:18s} {' | '.join(sorted(ops))}")
        for e in errors:
            print("   ERROR", e)
    return m, per_api, hs, errors


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                             "protocol", "testdata", "golden")
    bad = 0
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.isfile(os.path.join(d, "manifest.json")):
            _, _, _, errors = check_dir(d)
            bad += len(errors)
    print(f"{'OK' if not bad else 'FAILED'}: {bad} errors")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
