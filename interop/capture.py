#!/usr/bin/env python3
"""Record golden TCPStore traffic from a real torch.

Runs under any torch python (Debian's /usr/bin/python3 with torch 1.13, or a
venv from scripts/torch-envs.sh).  For each backend the installed torch has,
it starts a real TCPStore master on a free loopback port, puts a recording
relay (pure Python, threads) in front of it and drives two client TCPStores
through the relay with every store operation the Python API offers.

Output per (version, backend), in OUT/<label>-<backend>/:
  conn<N>.c2s / conn<N>.s2c   raw bytes of relay connection N (accept order)
  manifest.json               {torch, backend, generation, connections:[{file,
                               s2c_file, client, calls:[{api, args, c2s_start,
                               c2s_end, s2c_start, s2c_end, result|error}]}]}
With --pcap-dir, dumpcap records the client<->relay leg of the same run into
PCAPDIR/<label>-<backend>.pcapng.

Usage: python capture.py [--label 2.6.0] [--out protocol/testdata/golden]
                         [--pcap-dir replay/testdata/pcap] [--backend legacy|libuv|all]
"""
import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

TD = datetime.timedelta

# Generation by torch minor release, as confirmed in docs/protocol-confirmed.md.
GEN_BY_MINOR = {
    (1, 13): "G0", (2, 0): "G0", (2, 1): "G1", (2, 2): "G2", (2, 3): "G2",
    (2, 4): "G2", (2, 5): "G3", (2, 6): "G3", (2, 7): "G3", (2, 8): "G4",
    (2, 9): "G4", (2, 10): "G5", (2, 11): "G5", (2, 12): "G6", (2, 13): "G6",
    (2, 14): "G6", (2, 15): "G6",
}


def torch_minor():
    parts = torch.__version__.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def generation():
    mm = torch_minor()
    if mm in GEN_BY_MINOR:
        return GEN_BY_MINOR[mm]
    return "G?"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def probe_backends():
    """Which backends this torch can run: (has use_libuv kwarg, [backends], note)."""
    def try_store(**kw):
        st = dist.TCPStore("127.0.0.1", free_port(), None, True, TD(seconds=5), wait_for_workers=False, **kw)
        del st
    try:
        try_store(use_libuv=False)
    except TypeError:
        return False, ["legacy"], "TCPStore() has no use_libuv argument"
    try:
        try_store(use_libuv=True)
    except RuntimeError as e:  # 2.1.x PyPI wheels: "Libuv implementation missing"
        return True, ["legacy"], f"use_libuv=True fails: {str(e).splitlines()[0][:120]}"
    return True, ["legacy", "libuv"], ""


def make_store(port, is_master, backend, timeout=TD(seconds=10)):
    kw = dict(wait_for_workers=False)
    if backend is not None and HAS_USE_LIBUV:
        kw["use_libuv"] = (backend == "libuv")
    for _ in range(20):
        try:
            return dist.TCPStore("127.0.0.1", port, None, is_master, timeout, **kw)
        except RuntimeError as e:  # port raced away
            if is_master and "address already in use" in str(e).lower():
                port = free_port()
                continue
            raise
    raise RuntimeError("could not start store")


class Conn:
    def __init__(self, idx):
        self.idx = idx
        self.c2s = bytearray()
        self.s2c = bytearray()
        self.client = None
        self.calls = []


class Relay:
    """Thread relay 127.0.0.1:listen_port -> 127.0.0.1:upstream, recording bytes."""

    def __init__(self, listen_port, upstream):
        self.upstream = upstream
        self.lock = threading.Lock()
        self.conns = []
        self.last_activity = time.monotonic()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", listen_port))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                cs, _ = self.ls.accept()
            except OSError:
                return
            us = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (cs, us):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                c = Conn(len(self.conns))
                self.conns.append(c)
                self.last_activity = time.monotonic()
            threading.Thread(target=self._pump, args=(cs, us, c, "c2s"), daemon=True).start()
            threading.Thread(target=self._pump, args=(us, cs, c, "s2c"), daemon=True).start()

    def _pump(self, src, dst, c, d):
        buf = c.c2s if d == "c2s" else c.s2c
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with self.lock:
                buf += data
                self.last_activity = time.monotonic()
            try:
                dst.sendall(data)
            except OSError:
                return

    def settle(self, quiet=0.05, maxwait=2.0):
        """Wait until no bytes moved for `quiet` seconds, counting from now (bytes of a
        request without reply may still be in flight when the API call returns)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < maxwait:
            with self.lock:
                idle = time.monotonic() - max(self.last_activity, t0)
            if idle >= quiet:
                return
            time.sleep(quiet / 5)

    def snapshot(self):
        with self.lock:
            return [(len(c.c2s), len(c.s2c)) for c in self.conns]

    def close(self):
        self.closed = True
        self.ls.close()

    def dump(self):
        with self.lock:
            return [(bytes(c.c2s), bytes(c.s2c)) for c in self.conns]


def _relay_child(listen_port, upstream, ctl):
    r = Relay(listen_port, upstream)
    ctl.send(r.port)
    while True:
        try:
            cmd, arg = ctl.recv()
        except EOFError:
            os._exit(0)
        if cmd == "settle":
            r.settle(**arg)
            ctl.send(None)
        elif cmd == "snapshot":
            ctl.send(r.snapshot())
        elif cmd == "dump":
            ctl.send(r.dump())
        elif cmd == "close":
            r.close()
            ctl.send(None)
            os._exit(0)


class RelayProc:
    """The relay runs in a child process: some torch bindings (e.g. list_keys in
    2.15) hold the GIL while blocked on the socket, which would starve a relay
    thread in this process."""

    def __init__(self, listen_port, upstream):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        self.ctl, child = ctx.Pipe()
        self.proc = ctx.Process(target=_relay_child, args=(listen_port, upstream, child), daemon=True)
        self.proc.start()
        self.port = self.ctl.recv()
        self.plock = threading.Lock()
        self.conns = []  # parent-side Conn records (labels + calls), indexed like the child's
        self.lock = threading.RLock()

    def _rpc(self, cmd, arg=None):
        with self.plock:
            self.ctl.send((cmd, arg))
            return self.ctl.recv()

    def settle(self, quiet=0.05, maxwait=2.0):
        self._rpc("settle", {"quiet": quiet, "maxwait": maxwait})

    def snapshot(self):
        snap = self._rpc("snapshot")
        with self.lock:
            while len(self.conns) < len(snap):
                self.conns.append(Conn(len(self.conns)))
        return snap

    def dump(self):
        return self._rpc("dump")

    def close(self):
        self._rpc("close")
        self.proc.join(5)


def jsonable(v):
    if isinstance(v, bytes):
        try:
            return v.decode("ascii") if all(32 <= b < 127 for b in v) else {"hex": v.hex()}
        except Exception:
            return {"hex": v.hex()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, TD):
        return {"timedelta_s": v.total_seconds()}
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return repr(v)


class Driver:
    def __init__(self, relay):
        self.relay = relay

    def call(self, client_name, api, fn, *args, expect_error=False):
        self.relay.settle()
        before = self.relay.snapshot()
        rec = {"api": api, "args": jsonable(list(args))}
        if VERBOSE:
            print(f"  {client_name}: {api}{tuple(args)!r}", file=sys.stderr, flush=True)
        try:
            r = fn(*args)
            rec["result"] = jsonable(r)
        except Exception as e:  # recorded, e.g. timed-out wait
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if not expect_error:
                rec["unexpected_error"] = True
        self.relay.settle()
        after = self.relay.snapshot()
        touched = False
        for i, (a_c, a_s) in enumerate(after):
            if self.relay.conns[i].client != client_name:
                continue
            b_c, b_s = before[i] if i < len(before) else (0, 0)
            if a_c != b_c or a_s != b_s:
                e = dict(rec, c2s_start=b_c, c2s_end=a_c, s2c_start=b_s, s2c_end=a_s)
                self.relay.conns[i].calls.append(e)
                touched = True
        if not touched:
            # nothing on the wire (e.g. client-side NotImplementedError): keep it on the
            # client's first connection so the manifest says the API was tried
            for c in self.relay.conns:
                if c.client == client_name:
                    n, m = after[c.idx]
                    c.calls.append(dict(rec, c2s_start=n, c2s_end=n, s2c_start=m, s2c_end=m, wire=False))
                    break
        return rec

    def new_client(self, name, port, backend):
        self.relay.settle()
        n0 = len(self.relay.snapshot())
        st = make_store(port, False, backend)
        self.relay.settle(quiet=0.1)
        snap = self.relay.snapshot()
        with self.relay.lock:
            for c in self.relay.conns[n0:]:
                c.client = name
                c.calls.append({"api": "TCPStore()", "args": jsonable(["127.0.0.1", "relay", None, False]),
                                "c2s_start": 0, "c2s_end": snap[c.idx][0], "s2c_start": 0, "s2c_end": snap[c.idx][1]})
        return st


def run_ops(d, name, st, mm):
    def c(api, *a, **k):
        if hasattr(st, api):
            d.call(name, api, getattr(st, api), *a, **k)
    c("set", "k1", "v1")
    c("set", "bin", b"\x00\xff\x01")
    c("get", "k1")
    c("add", "cnt", 5)
    c("add", "cnt", -2)
    c("compare_set", "k1", "v1", "v2")
    c("compare_set", "nokey", "x", "y")
    c("compare_set", "new", "", "z")
    c("check", ["k1"])
    c("check", ["missing"])
    c("check", ["k1", "cnt"])
    d.call(name, "wait", lambda k: st.wait(k), ["k1"])
    d.call(name, "wait", lambda k, t: st.wait(k, t), ["k1", "cnt"], TD(seconds=5))
    d.call(name, "wait", lambda k, t: st.wait(k, t), ["never"], TD(milliseconds=300), expect_error=True)
    c("num_keys")
    c("delete_key", "new")
    c("delete_key", "new")
    if hasattr(st, "append"):
        c("append", "ap", "a")
        c("append", "ap", "bc")
        c("get", "ap")
    if hasattr(st, "multi_set"):
        c("multi_set", ["m1", "m2"], ["1", "22"])
    if hasattr(st, "multi_get"):
        c("multi_get", ["m1", "m2"])
    if hasattr(st, "queue_push"):
        c("queue_push", "q", "x", expect_error=True)
        c("queue_push", "q", "yy", expect_error=True)
        c("queue_len", "q", expect_error=True)
        d.call(name, "queue_pop", lambda k: st.queue_pop(k, block=False), "q", expect_error=True)
        d.call(name, "queue_pop", lambda k: st.queue_pop(k), "q", expect_error=True)
        d.call(name, "queue_pop", lambda k: st.queue_pop(k, block=False), "q", expect_error=True)
    if hasattr(st, "list_keys"):
        c("list_keys", expect_error=True)
    if hasattr(st, "barrier"):
        # single participant barrier completes at once
        d.call(name, "barrier", lambda k, w: st.barrier(k, w), "bar1", 1, expect_error=True)
    c("num_keys")


def capture(label, backend, out_root, pcap_dir):
    mm = torch_minor()
    mport = free_port()
    rport = free_port()
    relay = RelayProc(rport, mport)  # fork before the master's threads exist
    master = make_store(mport, True, backend)
    actual_backend = getattr(master, "libuvBackend", None)
    dumpcap = None
    if pcap_dir:
        os.makedirs(pcap_dir, exist_ok=True)
        pcap = os.path.join(pcap_dir, f"{label}-{backend}.pcapng")
        if os.path.exists(pcap):
            os.remove(pcap)
        # dumpcap runs as root here; write to a tmp file it can create, then move
        tmp = f"/tmp/storeguard-capture-{os.getpid()}.pcapng"
        dumpcap = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", f"tcp port {rport}", "-w", tmp],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        DUMPCAPS.append(dumpcap)
        time.sleep(1.5)  # let dumpcap start capturing
    d = Driver(relay)
    c1 = d.new_client("client1", relay.port, backend)
    run_ops(d, "client1", c1, mm)
    c2 = d.new_client("client2", relay.port, backend)
    # second client: sees client1's data; a WAIT that another client satisfies (deferred reply)
    d.call("client2", "get", c2.get, "k1")
    if hasattr(c2, "check"):
        d.call("client2", "check", c2.check, ["ap"] if hasattr(c2, "append") else ["cnt"])
    t = threading.Thread(target=lambda: d.call("client2", "wait", lambda k: c2.wait(k), ["late"]))
    t.start()
    time.sleep(0.3)
    d.call("client1", "set", c1.set, "late", "1")  # wakes client2's wait
    t.join(10)
    relay.settle()
    d.call("client2", "add", c2.add, "cnt", 1)
    d.call("client2", "num_keys", c2.num_keys)
    if hasattr(c2, "clone"):
        relay.settle()
        n0 = len(relay.snapshot())
        cs = c2.clone()
        relay.settle(quiet=0.1)
        snap = relay.snapshot()
        with relay.lock:
            for c in relay.conns[n0:]:
                c.client = "client2-clone"
                c.calls.append({"api": "clone()", "args": [], "c2s_start": 0, "c2s_end": snap[c.idx][0],
                                "s2c_start": 0, "s2c_end": snap[c.idx][1]})
        d.call("client2-clone", "get", cs.get, "k1")
        del cs
    del c1, c2
    relay.settle(quiet=0.2)
    if dumpcap:
        time.sleep(0.5)
        dumpcap.send_signal(signal.SIGINT)
        try:
            dumpcap.wait(10)
        except subprocess.TimeoutExpired:
            dumpcap.kill()
        shutil.move(tmp, pcap)
        os.chmod(pcap, 0o644)
    data = relay.dump()
    relay.snapshot()
    relay.close()
    outdir = os.path.join(out_root, f"{label}-{backend}")
    if os.path.isdir(outdir):
        shutil.rmtree(outdir)
    os.makedirs(outdir)
    conns = []
    with relay.lock:
        for c, (c2s, s2c) in zip(relay.conns, data):
            f = f"conn{c.idx}.c2s"
            with open(os.path.join(outdir, f), "wb") as fh:
                fh.write(c2s)
            with open(os.path.join(outdir, f"conn{c.idx}.s2c"), "wb") as fh:
                fh.write(s2c)
            conns.append({"file": f, "s2c_file": f"conn{c.idx}.s2c", "client": c.client,
                          "c2s_bytes": len(c2s), "s2c_bytes": len(s2c), "calls": c.calls})
    # wire-level cross-check of the generation
    wire_gen = None
    firsts = [c2s[:5] for c2s, _ in data if c2s]
    if firsts:
        wire_gen = "G2+" if all(f == b"\x00\xce\xf7\x85\x3c" for f in firsts) else "G0/G1"
    manifest = {
        "torch": label, "torch_version_string": torch.__version__, "backend": backend,
        "libuvBackend_property": actual_backend, "generation": generation(),
        "wire_first_message": wire_gen, "python": sys.version.split()[0],
        "backends_available": BACKENDS, "backend_note": NOTE,
        "connections": conns,
    }
    with open(os.path.join(outdir, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
    del master
    return outdir


def stop_dumpcaps():
    for p in list(DUMPCAPS):
        if p.poll() is None:
            p.kill()


def main():
    import atexit
    atexit.register(stop_dumpcaps)
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap.add_argument("--label", default=None, help="version label (default: torch.__version__ without local part)")
    ap.add_argument("--out", default=os.path.join(repo, "protocol", "testdata", "golden"))
    ap.add_argument("--pcap-dir", default=None)
    ap.add_argument("--backend", default="all", choices=["all", "legacy", "libuv"])
    a = ap.parse_args()
    label = a.label or torch.__version__.split("+")[0]
    backends = BACKENDS
    if NOTE:
        print(f"{label}: {NOTE}", file=sys.stderr)
    if a.backend != "all":
        backends = [a.backend]
    for b in backends:
        try:
            out = capture(label, b, a.out, a.pcap_dir)
            print(f"{label} {b} -> {out}", flush=True)
        except Exception as e:
            print(f"{label} {b} FAILED: {type(e).__name__}: {e}", flush=True)
            stop_dumpcaps()
            raise
    os._exit(0)  # do not hang on daemon relay threads / store destructors


HAS_USE_LIBUV = False
BACKENDS = ["legacy"]
NOTE = ""
DUMPCAPS = []  # dumpcap children, killed on failure/exit
VERBOSE = bool(os.environ.get("CAPTURE_VERBOSE"))
if __name__ == "__main__":
    HAS_USE_LIBUV, BACKENDS, NOTE = probe_backends()
    main()
