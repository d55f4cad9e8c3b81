#!/usr/bin/env python3
"""Decode what a recording relay (relay.py --record DIR) saw clients send to the store.

  store_trace.py DIR GENERATION [--writes]     # GENERATION: G0..G6 (the store's, as the guard learns it)

Prints one line per message: connection, op, keys and values (values shortened). --writes prints
the write table instead: per key, each writing op, how many times and on how many connections.
Uses golden_check's reference parser (no torch).
"""
import argparse
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_check import Short, parse_one, table  # noqa: E402

WRITE_OPS = ("SET", "COMPARE_SET", "MULTI_SET", "APPEND", "ADD", "DELETE_KEY", "QUEUE_PUSH")


def conn_files(d):
    d = Path(d)
    return sorted(d.glob("conn*.c2s"), key=lambda f: int(f.stem[4:])) if d.exists() else []


def decode(buf, gen):
    """[(op, fields)] of the whole messages in buf, and how many bytes trail them (a message cut off, or from
    an opcode the generation does not have on: the guard's own generation probes send such)."""
    names, msgs, off = table(gen), [], 0
    while off < len(buf):
        try:
            name, fields, end = parse_one(buf, off, names)
        except (Short, ValueError):
            break
        msgs.append((name, fields))
        off = end
    return msgs, len(buf) - off


def trace(d, gen):
    """[(conn, op, fields)] for every message of every recorded connection, in connection order."""
    out = []
    for f in conn_files(d):
        msgs, _ = decode(f.read_bytes(), gen)
        out += [(int(f.stem[4:]), op, fields) for op, fields in msgs]
    return out


def writes(d, gen):
    """[(conn, op, key, value)] for every write: SET/APPEND/QUEUE_PUSH (value), COMPARE_SET (the
    desired value; expected as value[0]), MULTI_SET (one row per pair), ADD (the delta), DELETE_KEY (None)."""
    rows = []
    for conn, op, fields in trace(d, gen):
        if op in ("SET", "APPEND", "QUEUE_PUSH"):
            rows.append((conn, op, fields[0], fields[1]))
        elif op == "COMPARE_SET":
            rows.append((conn, op, fields[0], (fields[1], fields[2])))
        elif op == "MULTI_SET":
            rows += [(conn, op, k, v) for k, v in fields[0]]
        elif op == "ADD":
            rows.append((conn, op, fields[0], fields[1]))
        elif op == "DELETE_KEY":
            rows.append((conn, op, fields[0], None))
    return rows


def write_table(rows):
    """{key: {op: (count, n_connections)}}."""
    t = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, set()]))
    for conn, op, key, _ in rows:
        t[key][op][0] += 1
        t[key][op][1].add(conn)
    return {k: {op: (c, len(conns)) for op, (c, conns) in ops.items()} for k, ops in t.items()}


def short(v, n=60):
    if isinstance(v, bytes):
        s = v.decode("latin-1")
        return repr(s if len(s) <= n else s[:n] + f"...({len(v)} B)")
    if isinstance(v, list):
        return "[" + ", ".join(short(x, 30) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(short(x, n) for x in v) + ")"
    return repr(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("generation")
    ap.add_argument("--writes", action="store_true")
    a = ap.parse_args()
    if a.writes:
        for key, ops in sorted(write_table(writes(a.dir, a.generation)).items()):
            print(key.decode("latin-1"), " ".join(f"{op}x{c}/{n}conn" for op, (c, n) in sorted(ops.items())))
        return
    for conn, op, fields in trace(a.dir, a.generation):
        print(conn, op, " ".join(short(f) for f in fields))


if __name__ == "__main__":
    main()
