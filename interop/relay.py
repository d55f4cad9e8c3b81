#!/usr/bin/env python3
"""Plain TCP forwarder LISTEN_PORT -> UPSTREAM_HOST:UPSTREAM_PORT on loopback (no torch).

A stand-in for the Go proxy when checking that a topology puts *every* store
connection through the proxy port: it counts the connections it forwarded and
prints {"connections": N} on SIGTERM/SIGINT or after --seconds.

  relay.py LISTEN_PORT UPSTREAM_PORT [--upstream-host 127.0.0.1] [--source ADDR] [--seconds S] [--record DIR]

--source binds each upstream connection to ADDR (another loopback address, 127.0.0.2): the guard behind
it sees the client as that source.
"""
import argparse
import json
import os
import signal
import socket
import threading


def pump(src, dst, rec=None):
    try:
        while True:
            d = src.recv(65536)
            if not d:
                break
            if rec is not None:
                rec.write(d)
                rec.flush()
            dst.sendall(d)
    except OSError:
        pass
    for s in (dst,):
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen_port", type=int)
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("--upstream-host", default="127.0.0.1")
    ap.add_argument("--source", default=None, metavar="ADDR", help="bind upstream connections to ADDR")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--record", default=None, metavar="DIR", help="write DIR/conn<N>.c2s and .s2c")
    a = ap.parse_args()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.listen_port))
    ls.listen(256)
    count = [0]
    done = threading.Event()

    def accept():
        while True:
            c, _ = ls.accept()
            try:
                u = socket.create_connection((a.upstream_host, a.upstream_port),
                                             source_address=(a.source, 0) if a.source else None)
            except OSError:  # refused upstream (a guard refusing the source): the client sees its close
                c.close()
                continue
            n = count[0]
            count[0] += 1
            rc = rs = None
            if a.record:
                os.makedirs(a.record, exist_ok=True)
                rc = open(os.path.join(a.record, f"conn{n}.c2s"), "wb")
                rs = open(os.path.join(a.record, f"conn{n}.s2c"), "wb")
            threading.Thread(target=pump, args=(c, u, rc), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, rs), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(json.dumps({"listening": ls.getsockname()[1]}), flush=True)
    done.wait(a.seconds)
    print(json.dumps({"connections": count[0]}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
