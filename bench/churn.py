"""A churn attack and a new rank beside it, for bench/scale.sh.

usage: python churn.py PORT RATE SECONDS SOURCES

Opens RATE one-message connections a second for SECONDS, spread over SOURCES loopback addresses
(127.20.0.1, 127.20.0.2, ...; each RATE/SOURCES a second), each sending torch 2.5+'s handshake
(VALIDATE, PING) and a GETNUMKEYS and closing at once. A new rank from its own address
(127.30.0.1, .2, ...) times its first op (handshake and GETNUMKEYS answered) at 2 s, at SECONDS - 2
and once the churn is over. Prints one JSON line: {"first_op_s": {label: seconds or error},
"churn_sent": n}.
"""
import json
import socket
import sys
import threading
import time

HANDSHAKE = bytes.fromhex("00cef7853c") + bytes.fromhex("0d01000000")  # VALIDATE, PING (torch 2.5+)
NUMKEYS = bytes([7])


def recv_exactly(s, n):
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            raise ConnectionError("closed after %d bytes" % len(got))
        got += chunk
    return got


def first_op(port, source, timeout=60):
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
        s.sendall(HANDSHAKE + NUMKEYS)
        recv_exactly(s, 4 + 8)
    return time.monotonic() - t0


def main():
    port, rate, seconds, sources = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    took, threads, sent = {}, [], 0

    def rank(label, source):
        try:
            took[label] = round(first_op(port, source), 4)
        except OSError as e:
            took[label] = repr(e)

    pending = [(2.0, "at 2 s", "127.30.0.1"), (seconds - 2, "at %g s" % (seconds - 2), "127.30.0.2")]
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        while pending and time.monotonic() - start >= pending[0][0]:
            _, label, source = pending.pop(0)
            threads.append(threading.Thread(target=rank, args=(label, source)))
            threads[-1].start()
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5,
                                         source_address=("127.20.0.%d" % (i % sources + 1), 0))
            s.sendall(HANDSHAKE + NUMKEYS)
            s.close()
            sent += 1
        except OSError:
            pass  # refused at accept: fine
        time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    for t in threads:
        t.join(120)
    rank("after", "127.30.0.3")
    print(json.dumps({"first_op_s": took, "churn_sent": sent}))


if __name__ == "__main__":
    main()
