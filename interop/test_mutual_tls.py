"""Mutual TLS between guards (issue #27) under real torch, on one host: a world-4 gloo job whose
store is reached only through `storeguard connect` (the client guard, on a local port) and
`storeguard serve --tls-mode on` (loopback narrowed out of tls.plaintext-sources, so every rank
must come through the client guard), with two upgrades in place of each end while it runs: 0 failed
store ops, every ADD applied once, the serving guard's events naming the client guard's identity.
A plaintext client and a client guard of another CA each get nothing to the store.

scripts/netns-mtls.sh runs the same across three network namespaces, with torchrun.
"""
import json
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from test_interop import ENVS, binary, free_port, procs, start_store  # noqa: F401
from test_zero_downtime import GAP, JOB_STORES, Job, PidFileGuard, check_job, guards, handover_events  # noqa: F401

MASTER, WORKER = "spiffe://sg.test/storeguard/master", "spiffe://sg.test/storeguard/worker/w1"


def pki(tmp, name="ca"):
    """A CA (dir tmp/name) and a certificate for the master's and the worker's guard, as the
    README makes them."""
    d = Path(tmp) / name
    d.mkdir()

    def sh(*args):
        subprocess.run(args, cwd=d, check=True, capture_output=True)
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
       "-out", "ca.crt", "-days", "1", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for role, uri in (("master", MASTER), ("worker", WORKER)):
        (d / f"{role}.ext").write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                       f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=URI:{uri}\n")
        sh("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
           f"{role}.key", "-out", f"{role}.csr", "-subj", f"/CN={role}")
        sh("openssl", "x509", "-req", "-in", f"{role}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
           "-days", "1", "-extfile", f"{role}.ext", "-out", f"{role}.crt")
    return d


class ConnectGuard(PidFileGuard):
    """`storeguard connect --pid-file` on a local port, carrying to server over mutual TLS."""

    def __init__(self, procs, binary, server, tmp, pki_dir, allow=MASTER):  # noqa: F811
        self.port, self.mport = free_port(), free_port()
        self.pidfile = Path(tmp) / f"connect-{self.port}.pid"
        self.logpath = Path(tmp) / f"connect-{self.port}.log"
        self.auditpath = Path(tmp) / "none"
        self.keeper = False
        log = open(self.logpath, "w")
        cmd = [binary, "connect", "--listen", f"127.0.0.1:{self.port}", "--server", f"127.0.0.1:{server}",
               "--metrics-listen", f"127.0.0.1:{self.mport}", "--pid-file", str(self.pidfile), "--log-format", "text",
               "--tls-cert", str(pki_dir / "worker.crt"), "--tls-key", str(pki_dir / "worker.key"),
               "--tls-ca", str(pki_dir / "ca.crt"), "--tls-allow", allow]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        procs.procs.append(self.proc)
        self.pids = []
        self.wait_ready()
        self.wait_pid(lambda p: p == self.proc.pid, "no pid file once listening")

    def wait_ready(self):
        for _ in range(200):
            assert self.proc.poll() is None, f"storeguard connect exited {self.proc.returncode}: {self.log()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/healthz", timeout=2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("storeguard connect never listened")

    def handovers_logged(self):
        return self.log().count("upgrade: took over")

    def metric(self, name):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None


def serving_guard(procs, binary, sport, tmp, d, guards, keeper=False):  # noqa: F811
    g = PidFileGuard(procs, binary, sport, tmp, keeper=keeper, extra=(
        "--tls-mode", "on", "--tls-cert", str(d / "master.crt"), "--tls-key", str(d / "master.key"),
        "--tls-ca", str(d / "ca.crt"), "--tls-allow", "spiffe://sg.test/storeguard/worker/*",
        "--tls-plaintext-sources", "127.0.0.2/32"))
    guards.append(g)
    return g


# torch 1.13 (legacy, the old protocol) and torch 2.15 (libuv): the serving guard judges the
# plaintext it opens itself (a tlsrelay.End); without a keeper an upgrade hands each connection over
# as a relay and the new process makes it an End again (EndFrom); under a keeper the End keeps its
# state in the ledger's slot, which an upgrade hands off and a kill -9 leaves to the next worker.
# scripts/netns-mtls.sh runs torch 2.15 through both guards under their keepers with torchrun across
# three namespaces.
MTLS_JOB_STORES = JOB_STORES


@pytest.mark.parametrize("version,backend", MTLS_JOB_STORES, ids=[f"{v}-{b}" for v, b in MTLS_JOB_STORES])
def test_a_gloo_job_through_both_guards_and_their_upgrades(procs, binary, guards, tmp_path, version, backend):  # noqa: F811
    """The job through connect and serve with mutual TLS; 2 upgrades of each end, interleaved: 0
    failed ops, the counter exact, and the relays handed over each time."""
    d = pki(tmp_path)
    store, sport = start_store(procs, version, backend)
    server = serving_guard(procs, binary, sport, tmp_path, d, guards)
    client = ConnectGuard(procs, binary, server.port, tmp_path, d)
    guards.append(client)
    job = Job(procs, version, backend, client.port, tmp_path)
    job.wait_steps(20)
    relays = client.metric("storeguard_connect_relays_active")
    assert relays and relays >= 4, f"{relays} relays: the ranks do not come through the client guard"
    for g in (client, server, client, server):
        time.sleep(GAP)
        g.upgrade()
        job.wait_steps(5)
    time.sleep(GAP)
    steps, ops = check_job(job.finish())
    assert len(handover_events(server, 2)) >= 2
    moved = [int(m) for m in re.findall(r"upgrade: took over.*?relays=(\d+)", client.log())]
    assert len(moved) == 2 and min(moved) >= 4, f"the client guard's hand-overs moved {moved} relays"
    flows = [json.loads(x) for x in Path(str(server.auditpath) + ".flows").read_text().splitlines()] \
        if Path(str(server.auditpath) + ".flows").exists() else []
    events = server.events()
    bad = [e for e in events if e.get("event.action") in ("blocked", "would_block", "denied", "banned")]
    assert not bad, f"the serving guard refused the job's traffic: {bad[:3]}"
    ids = {e.get("storeguard.identity") for e in events + flows if e.get("storeguard.identity")}
    assert ids == {WORKER} or (not ids and not flows), f"identities seen: {ids}"
    print(f"{version}-{backend}: {steps} steps, {ops} store ops by 4 ranks through mutual TLS, 4 upgrades")


def test_strangers_get_nothing_to_the_store(procs, binary, guards, tmp_path):  # noqa: F811
    """A plaintext TCPStore client and a client guard whose certificate is of another CA: each is
    refused at the handshake, audited with why, and no byte of theirs reaches the store (a
    recording relay in front of it)."""
    version = JOB_STORES[-1][0]
    d, other = pki(tmp_path), pki(tmp_path, "other")
    relay_port = free_port()
    store, sport = start_store(procs, version, "libuv")
    # A recording relay between the guard and the store: every connection the guard opens to it.
    rec = subprocess.Popen([ENVS[version], str(Path(__file__).with_name("relay.py")), str(relay_port), str(sport),
                            "--record", str(tmp_path / "rec")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                           start_new_session=True)  # procs stops process groups
    procs.procs.append(rec)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", relay_port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    server = serving_guard(procs, binary, relay_port, tmp_path, d, guards)
    # The stranger trusts the master's CA (so that its own check of the master passes and the master
    # judges its certificate), and presents a certificate of another CA.
    mixed = tmp_path / "stranger"
    mixed.mkdir()
    for f in ("worker.crt", "worker.key"):
        (mixed / f).write_bytes((other / f).read_bytes())
    (mixed / "ca.crt").write_bytes((d / "ca.crt").read_bytes())
    stranger = ConnectGuard(procs, binary, server.port, tmp_path, mixed)
    guards.append(stranger)
    code = ("import datetime, torch.distributed as d\n"
            "try:\n d.TCPStore('127.0.0.1', %d, is_master=False, timeout=datetime.timedelta(seconds=3)).set('/torchelastic/x', 'y')\n"
            "except Exception as e:\n print('refused', type(e).__name__)\n")
    for port in (server.port, stranger.port):
        out = subprocess.run([ENVS[version], "-c", code % port], capture_output=True, text=True, timeout=120)
        assert "refused" in out.stdout, f"a stranger's SET through port {port}: {out.stdout} {out.stderr[-2000:]}"
    deadline = time.monotonic() + 10
    while True:
        reasons = {e.get("event.reason") for e in server.events() if e.get("event.action") == "denied"}
        if {"tls_not_tls", "tls_unknown_ca"} <= reasons or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {"tls_not_tls", "tls_unknown_ca"} <= reasons, f"denials: {reasons}"
    # The guard's own probes of the store (its generation) pass the recorder too: what matters is that
    # no byte of the strangers' SET is among what reached the store.
    seen = b"".join(f.read_bytes() for f in (tmp_path / "rec").glob("*.c2s")) if (tmp_path / "rec").exists() else b""
    assert b"/torchelastic/x" not in seen, "a stranger's SET reached the store"


@pytest.mark.parametrize("version,backend", MTLS_JOB_STORES, ids=[f"{v}-{b}" for v, b in MTLS_JOB_STORES])
def test_a_gloo_job_through_a_kept_serving_guard_and_its_kills(procs, binary, guards, tmp_path, version, backend):  # noqa: F811
    """The job through connect and `serve --keeper` with mutual TLS, the serving guard upgraded twice
    and its worker killed (kill -9) twice: each TLS connection goes on from its End's slot in the
    keeper's ledger (torch 1.13 sends a message's opcode apart from the rest, so a kill can find one
    half received), with 0 failed ops, the counter exact, and no connection closed by a restart."""
    d = pki(tmp_path)
    store, sport = start_store(procs, version, backend)
    server = serving_guard(procs, binary, sport, tmp_path, d, guards, keeper=True)
    client = ConnectGuard(procs, binary, server.port, tmp_path, d)
    guards.append(client)
    job = Job(procs, version, backend, client.port, tmp_path)
    job.wait_steps(20)
    for kind in "UKUK":
        time.sleep(GAP)
        server.upgrade() if kind == "U" else server.crash()
        job.wait_steps(5)
    time.sleep(GAP)
    steps, ops = check_job(job.finish())
    log = server.log()
    restored = [int(n) for n in re.findall(r"took every connection back from the keeper\"? connections=\d+ kept_ends=(\d+)", log)]
    assert len(restored) == 2 and min(restored) >= 4, f"the restarts took back {restored} TLS connections as kept Ends"
    handed = [int(n) for n in re.findall(r"handover complete\"? connections=\d+ kept_ends=(\d+)", log)]
    assert len(handed) == 2 and min(handed) >= 4, f"the upgrades handed {handed} TLS connections off as kept Ends"
    assert "cannot go on" not in log and "closing it" not in log, log[-3000:]
    bad = [e for e in server.events() if e.get("event.action") in ("blocked", "would_block", "denied", "banned")]
    assert not bad, f"the serving guard refused the job's traffic: {bad[:3]}"
    print(f"{version}-{backend}: {steps} steps, {ops} store ops by 4 ranks through mutual TLS, 2 upgrades, 2 kills")
