#!/usr/bin/env python3
"""Plain TCP listener that records what each client sends first; it never answers.

Used to capture probename/testdata/observed.json: run it on a loopback port, point one tool at
it, and each connection's first bytes (up to MAX bytes, until the client stops sending for
QUIET seconds after its first byte, or IDLE seconds with nothing at all) go to the log file as
one JSON line. It waits longer than nmap's NULL probe (6 s) before closing a silent connection,
so nmap moves on to its send probes instead of calling the port tcpwrapped. It turns on TCP
keepalive every second: masscan's user-space TCP stack runs its timers (and so sends its hello)
only when a packet arrives, and a keepalive probe carries no data.

    capture.py PORT LOGFILE
"""
import json
import socket
import sys
import threading
import time

MAX = 1024
QUIET = 1.0
IDLE = 8.0


def handle(conn, peer, log, lock):
    start = time.time()
    data = b""
    end = "max"
    first = None  # seconds from accept to the first byte
    try:
        while len(data) < MAX:
            conn.settimeout(QUIET if data else IDLE)
            try:
                chunk = conn.recv(MAX - len(data))
            except socket.timeout:
                end = "quiet" if data else "idle"
                break
            except OSError as e:
                end = "error:" + e.__class__.__name__
                break
            if not chunk:
                end = "eof"
                break
            if first is None:
                first = round(time.time() - start, 3)
            data += chunk
    finally:
        conn.close()
    rec = {"t": round(start, 3), "peer": "%s:%d" % peer, "len": len(data), "end": end,
           "first_byte_after_s": first,
           "hex": data.hex()}
    with lock:
        log.write(json.dumps(rec) + "\n")
        log.flush()


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ln.bind(("127.0.0.1", port))
    ln.listen(128)
    lock = threading.Lock()
    with open(path, "a") as log:
        while True:
            conn, peer = ln.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
            threading.Thread(target=handle, args=(conn, peer, log, lock), daemon=True).start()


if __name__ == "__main__":
    main()
