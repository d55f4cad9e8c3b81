#!/usr/bin/env python3
"""Raw-socket probes of a real TCPStore server's handshake and opcode checks.

For each backend the installed torch has, starts a master on loopback and
sends hand-built byte sequences, then reports whether the server closed the
connection and whether a non-VALIDATE first message was executed. Prints one
JSON object per (torch, backend). Used for docs/protocol-confirmed.md.

  python interop/validate_probe.py            (G2+ torch only: >= 2.2)
"""
import datetime
import json
import os
import socket
import struct
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capture import free_port, probe_backends  # noqa: E402

TD = datetime.timedelta
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
PING = b"\x0d" + struct.pack("<I", 4242)


def s_(b):
    return struct.pack("<Q", len(b)) + b


def SET(k, v):
    return b"\x01" + s_(k) + s_(v)


NUMKEYS = b"\x07"


def conn(port):
    return Sock(port)


class Sock:
    """socket wrapper that remembers a reset during send."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=2)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.dead = None

    def sendall(self, b):
        if self.dead:
            return
        try:
            self.s.sendall(b)
        except OSError as e:
            self.dead = f"closed(during send: {type(e).__name__})"

    def close(self):
        self.s.close()


def closed_after(sk, wait=0.5):
    if sk.dead:
        return sk.dead
    return _closed_after(sk.s, wait)


def _closed_after(s, wait=0.5):
    """Return ('closed'|'open'|'data:<hex>') after waiting for the server."""
    s.settimeout(wait)
    try:
        d = s.recv(4096)
        return "closed" if d == b"" else "data:" + d.hex()
    except socket.timeout:
        return "open"
    except OSError:
        return "closed(reset)"


def exists(master, key):
    return master.check(["probe/" + key]) if hasattr(master, "check") else None


def probe(backend):
    port = free_port()
    kw = {"use_libuv": backend == "libuv"}
    master = dist.TCPStore("127.0.0.1", port, None, True, TD(seconds=5), wait_for_workers=False, **kw)
    r = {"torch": torch.__version__.split("+")[0], "backend": backend,
         "libuvBackend": getattr(master, "libuvBackend", None)}
    K = lambda n: b"/probe/" + n.encode()  # noqa: E731  (the client prefixes "/")

    # 1. first message SET (not VALIDATE), alone in one write
    s = conn(port)
    s.sendall(SET(K("a"), b"1"))
    r["set_first_alone"] = closed_after(s)
    r["set_first_alone_executed"] = exists(master, "a")
    # 1b. ... then one more byte (GETNUMKEYS) in a later write
    if r["set_first_alone"] == "open":
        s.sendall(NUMKEYS)
        r["set_first_then_numkeys"] = closed_after(s)
        r["set_first_then_numkeys_executed"] = exists(master, "a")
    s.close()
    # 2. first message SET split over two writes
    s = conn(port)
    m = SET(K("b"), b"1")
    s.sendall(m[:5])
    time.sleep(0.2)
    s.sendall(m[5:])
    r["set_first_split"] = closed_after(s)
    r["set_first_split_executed"] = exists(master, "b")
    s.close()
    # 3. wrong magic, alone; then more data
    s = conn(port)
    s.sendall(b"\x00" + struct.pack("<I", 0x12345678))
    r["bad_magic_alone"] = closed_after(s)
    if r["bad_magic_alone"] == "open":
        s.sendall(NUMKEYS)
        r["bad_magic_then_numkeys"] = closed_after(s)
    s.close()
    # 4. correct VALIDATE split 2+3 bytes
    s = conn(port)
    s.sendall(VALIDATE[:2])
    time.sleep(0.2)
    s.sendall(VALIDATE[2:])
    time.sleep(0.1)
    s.sendall(NUMKEYS)
    r["validate_split_then_numkeys"] = closed_after(s)
    s.close()
    # 5. VALIDATE twice
    s = conn(port)
    s.sendall(VALIDATE)
    time.sleep(0.1)
    s.sendall(VALIDATE)
    r["validate_twice"] = closed_after(s)
    s.close()
    # 6. PING before VALIDATE
    s = conn(port)
    s.sendall(PING)
    r["ping_first"] = closed_after(s)
    s.close()
    # 7. VALIDATE + PING (G3+: echo)
    s = conn(port)
    s.sendall(VALIDATE + PING)
    r["validate_ping"] = closed_after(s)
    s.close()
    # 8. VALIDATE + NUMKEYS pipelined in one write
    s = conn(port)
    s.sendall(VALIDATE + NUMKEYS)
    r["validate_numkeys_one_write"] = closed_after(s)
    s.close()
    # 9. opcodes after a good VALIDATE: which are unknown to the server (close)?
    unknown = []
    for op in range(13, 32):
        s = conn(port)
        s.sendall(VALIDATE)
        time.sleep(0.02)
        s.sendall(bytes([op]))
        res = closed_after(s, 0.3)
        if res.startswith("closed"):
            unknown.append(op)
        s.close()
    r["opcodes_13_31_closed_alone"] = unknown
    # 10. libuv key-length limit (8192 ok, 8193 closed), legacy for comparison
    for n in (8192, 8193):
        s = conn(port)
        s.sendall(VALIDATE)
        time.sleep(0.02)
        s.sendall(b"\x03" + struct.pack("<Q", n))  # GET with declared key length n
        r[f"get_keylen_{n}_header_only"] = closed_after(s, 0.3)
        s.close()
    s = conn(port)
    s.sendall(VALIDATE)
    s.sendall(b"\x01" + s_(K("big")) + struct.pack("<Q", 8 * 1024 * 1024 + 1))
    r["set_value_8MiB+1_header_only"] = closed_after(s, 0.3)
    s.close()
    s = conn(port)
    s.sendall(VALIDATE)
    s.sendall(b"\x05" + struct.pack("<Q", 128 * 1024 + 1))
    r["check_count_131073_header_only"] = closed_after(s, 0.3)
    s.close()
    # the store still answers
    r["store_alive_num_keys"] = master.num_keys()
    del master
    return r


def main():
    _, backends, note = probe_backends()
    for b in backends:
        print(json.dumps(probe(b), sort_keys=True), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
