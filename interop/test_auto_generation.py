"""`generation: auto` (the default) against every pinned release and backend of real torch.

The guard learns the store's generation from the store and frames every forwarded byte by it. A
recording relay sits between guard and store, so each test can say what reached the store: for
every hostile case, 0 bytes of the hostile connection; the store's RSS stays flat and a benign op
through the guard stays fast while the hostile connection is held open.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from test_interop import (COMBOS, ENVS, HERE, VERSIONS, Guard, binary, procs, default_backend, free_port, handshake,
                          last_json, minor, numkeys_op, rss_kib, run_py, start_store, wait_ready)


def generation(version, backend):
    """The generation the store speaks, as the guard must learn it (docs/protocol.md)."""
    m = minor(version)
    if m <= (2, 0):
        return "G0"
    if m == (2, 1):
        return "G1"
    if m <= (2, 4):
        return "G2"
    if m <= (2, 7) or (m <= (2, 9) and backend == "legacy"):  # legacy 2.8/2.9 have no queue ops: as G3
        return "G3"
    if m <= (2, 9):
        return "G4"
    if m <= (2, 11):
        return "G5"
    return "G6"


class Relay:
    """interop/relay.py between guard and store, recording each connection's bytes."""

    def __init__(self, procs, store_port, tmp):
        self.port = free_port()
        self.dir = Path(tmp) / f"relay-{self.port}"
        p = procs.start(["python3", str(HERE / "relay.py"), str(self.port), str(store_port), "--record", str(self.dir)])
        assert json.loads(p.stdout.readline())["listening"] == self.port

    def conns(self):
        return sorted(self.dir.glob("conn*.c2s"), key=lambda f: int(f.stem[4:])) if self.dir.exists() else []


def guarded_store(procs, binary, tmp_path, version, backend):
    store, sport = start_store(procs, version, backend)
    relay = Relay(procs, sport, tmp_path)
    guard = Guard(procs, binary, relay.port, "auto", tmp_path)
    # /readyz: the store accepts connections and, in auto, its generation is known. (Waiting on
    # readiness, not on the store_info metric, lets this suite run against builds without it.)
    wait_ready(guard.mport, "the guard")
    return store, relay, guard


def benign_op_seconds(version, port):
    """A GETNUMKEYS with the release's handshake, through the guard; seconds until its reply."""
    hs = handshake(version)
    want = 8 + (4 if minor(version) >= (2, 5) else 0)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(hs + numkeys_op(version))
        got = b""
        while len(got) < want:
            chunk = c.recv(64)
            assert chunk, "the benign client was closed"
            got += chunk
    return time.monotonic() - t0


VALIDATE = bytes.fromhex("00cef7853c")
G6_SET_EMPTY = bytes.fromhex("01") + bytes(16)  # SET "" = "" in G2+ numbering
NMAP_106294 = bytes.fromhex("0300000b06e00000000000")


def hostile_cases(version):
    if minor(version) <= (2, 1):
        cases = {"validate-held-open": (VALIDATE, "validate_to_legacy_store"),
                 "validate-then-g6-set": (VALIDATE + G6_SET_EMPTY, "validate_to_legacy_store")}
        if minor(version) == (2, 1):
            # G1 APPEND's head: a guard that reads it as G0 DELETE_KEY forwards it whole, and the store
            # waits inside the APPEND for a value. Read as G1, it is held: nothing is forwarded.
            cases["append-head-held-open"] = (bytes([8]) + (1).to_bytes(8, "little") + b"k", None)
        return cases
    return {"nmap-106294-without-validate": (NMAP_106294, "validate_missing")}


HOSTILE = [(v, b, name) for v, b in COMBOS for name in hostile_cases(v)]


@pytest.mark.parametrize("version,backend,case", HOSTILE, ids=[f"{v}-{b}-{c}" for v, b, c in HOSTILE])
def test_auto_nothing_hostile_reaches_the_store(procs, binary, tmp_path, version, backend, case):
    store, relay, guard = guarded_store(procs, binary, tmp_path, version, backend)
    data, rule = hostile_cases(version)[case]
    quiet = benign_op_seconds(version, guard.port)
    rss0 = rss_kib(store.pid)
    before = len(relay.conns())
    hostile = socket.create_connection(("127.0.0.1", guard.port))
    hostile.sendall(data)
    time.sleep(1.0)
    held = benign_op_seconds(version, guard.port)  # while the hostile connection is open
    time.sleep(0.5)
    growth = rss_kib(store.pid) - rss0
    hostile.close()
    new = relay.conns()[before:]
    # Every store connection opened since the hostile one: the benign op's (its own bytes) and,
    # if the guard connected the hostile client, that one, which must be empty.
    benign = handshake(version) + numkeys_op(version)
    for f in new:
        got = f.read_bytes()
        assert got in (b"", benign), f"{f.name}: the store received {got.hex()}"
    assert growth < 32 * 1024, f"store RSS grew {growth} KiB"
    assert held < max(20 * quiet, 0.5), f"benign op {held * 1e3:.1f} ms with the hostile connection open (quiet {quiet * 1e3:.1f} ms)"
    evs = guard.events()
    if rule:
        assert [e["event.reason"] for e in evs] == [rule], evs
        assert evs[0]["storeguard.generation"] == generation(version, backend)
        m = guard.metrics()
        assert m.get(f'storeguard_violations_total{{mode="enforce",rule="{rule}"}}') == 1
    else:
        # Held, never judged whole: the only event is the message cut short when the client left
        # (truncated_message, blocked), which the guard writes once it sees the close.
        deadline = time.monotonic() + 10
        while not evs and time.monotonic() < deadline:
            time.sleep(0.1)
            evs = guard.events()
        assert [e["event.reason"] for e in evs] == ["truncated_message"], evs
    m = guard.metrics()
    assert m.get(f'storeguard_store_info{{backend="{backend}",generation="{generation(version, backend)}"}}') == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_auto_client_before_store_runs_every_op(procs, binary, tmp_path, version):
    """The sidecar order: guard first, then a client that connects before the store listens (held
    by the guard, not guessed), then the store. Every op of the release's API must work."""
    backend = default_backend(version)
    sport = free_port()
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    args = [str(HERE / "workload.py"), "127.0.0.1", str(guard.port), "--role", "client", "--prefix", "early"]
    if minor(version) >= (2, 2):
        args += ["--use-libuv", "1" if backend == "libuv" else "0"]
    client = subprocess.Popen([ENVS[version], *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    procs.procs.append(client)
    time.sleep(3)  # the client is connected to the guard and waiting
    start_store(procs, version, backend, port=sport)
    out, err = client.communicate(timeout=180)
    res = last_json(out)
    assert client.returncode == 0 and res and res["ok"], f"rc={client.returncode} {out[-2000:]} {err[-2000:]}"
    guard.assert_clean()
    assert guard.metrics().get('storeguard_store_generation_waits_total{result="learned"}', 0) >= 1


SLOW = [v for v in VERSIONS if minor(v) == (2, 1)] + [v for v in VERSIONS if minor(v) == (1, 13)]


@pytest.mark.parametrize("version", SLOW)
def test_auto_slow_store_is_asked_again_not_guessed(procs, binary, tmp_path, version):
    """A store that does not answer the guard's probes (stopped with SIGSTOP for 4 s, longer than a
    probe's 3 s) is asked again; a client that arrives meanwhile waits, then runs every op."""
    store, sport = start_store(procs, version, "legacy")
    os.kill(store.pid, signal.SIGSTOP)
    try:
        guard = Guard(procs, binary, sport, "auto", tmp_path)
        args = [str(HERE / "workload.py"), "127.0.0.1", str(guard.port), "--role", "client", "--prefix", "slow"]
        client = subprocess.Popen([ENVS[version], *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        procs.procs.append(client)
        time.sleep(4)
        assert not any(k.startswith("storeguard_store_info{") for k in guard.metrics()), "a generation was guessed"
    finally:
        os.kill(store.pid, signal.SIGCONT)
    out, err = client.communicate(timeout=180)
    res = last_json(out)
    assert client.returncode == 0 and res and res["ok"], f"rc={client.returncode} {out[-2000:]} {err[-2000:]}"
    m = guard.metrics()
    assert m.get('storeguard_store_probes_total{result="failed"}', 0) >= 1
    assert m.get(f'storeguard_store_info{{backend="legacy",generation="{generation(version, "legacy")}"}}') == 1
    guard.assert_clean()


@pytest.mark.parametrize("version,backend", COMBOS, ids=[f"{v}-{b}" for v, b in COMBOS])
def test_identify_names_every_release(procs, binary, version, backend):
    _, sport = start_store(procs, version, backend)
    p = subprocess.run([binary, "identify", "--target", f"127.0.0.1:{sport}"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert (got["generation"], got["backend"]) == (generation(version, backend), backend)
