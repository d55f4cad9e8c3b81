"""Real torch is the judge: every release and backend of interop/torch-versions.txt (plus Debian's
1.13), through `storeguard serve`, against a real TCPStore.

Run by scripts/test.sh (`python3 -m pytest interop`). STOREGUARD_BIN names the binary (built with
`go build ./cmd/storeguard` when unset). Each test starts its own store and guard on free loopback
ports and stops them.
"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "interop"


# --- environments ------------------------------------------------------------------------------

def _envs():
    out = subprocess.run([str(ROOT / "scripts/torch-envs.sh")], check=True, capture_output=True, text=True).stdout
    envs = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            envs[parts[0]] = parts[1]
    return envs


ENVS = _envs()


def minor(version):
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def backends(version):
    # 1.13 and 2.0 have only the legacy server; PyPI's 2.1 wheels lack libuv (docs/protocol-confirmed.md).
    return ["legacy"] if minor(version) <= (2, 1) else ["legacy", "libuv"]


def release(version):
    return "%d.%d" % minor(version)


def default_backend(version):
    return "libuv" if minor(version) >= (2, 4) else "legacy"


COMBOS = [(v, b) for v in ENVS for b in backends(v)]


@pytest.fixture(scope="session")
def binary():
    b = os.environ.get("STOREGUARD_BIN")
    if not b:
        b = os.path.join(tempfile.mkdtemp(), "storeguard")
        subprocess.run(["go", "build", "-o", b, "./cmd/storeguard"], cwd=ROOT, check=True)
    return b


# --- processes -----------------------------------------------------------------------------------

_handed_out = set()  # ports free_port returned: never twice in one run


def free_port():
    """A port nothing listens on, and not handed out before, below the kernel's ephemeral range: a port the kernel handed out
    (bind to 0) can meanwhile become another connection's local port (tests that open thousands of
    connections use them up), and the store's listen then fails with EADDRINUSE."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        if port in _handed_out:
            continue  # free now, but another caller's, whose listener may not be up yet
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    def __init__(self):
        self.procs = []

    def start(self, cmd, **kw):
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.stop_all()


def start_store(procs, version, backend, port=None, nofile=None, wrap=None):
    """A real store; nofile: its soft RLIMIT_NOFILE (1024 is the usual default outside this sandbox);
    wrap: a function of the command that returns the command to run instead."""
    port = port or free_port()
    cmd = [ENVS[version], str(HERE / "workload.py"), "127.0.0.1", str(port), "--role", "master"]
    if minor(version) >= (2, 2):
        cmd += ["--use-libuv", "1" if backend == "libuv" else "0"]
    if wrap:
        cmd = wrap(cmd)
    limit = None
    if nofile:
        import resource
        limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    p = procs.start(cmd, preexec_fn=limit)
    line = p.stdout.readline()
    assert line and json.loads(line).get("ready"), f"store did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
    return p, port


def wait_ready(mport, what, check=None):
    """Until /readyz answers 200: the store accepts connections and, in auto, its generation is known.
    check, if given, runs before each try (to fail at once when storeguard has exited)."""
    for _ in range(300):
        if check:
            check()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} never became ready")


class Guard:
    def __init__(self, procs, binary, upstream, generation, tmp, extra=()):
        self.port, self.mport = free_port(), free_port()
        self.audit = Path(tmp) / f"audit-{self.port}.jsonl"
        self.log = open(Path(tmp) / f"guard-{self.port}.log", "w")
        self.proc = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{self.port}",
                                      "--upstream", f"127.0.0.1:{upstream}", "--metrics-listen",
                                      f"127.0.0.1:{self.mport}", "--audit-log", str(self.audit),
                                      "--generation", generation, "--log-format", "text", *extra],
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        procs.procs.append(self.proc)
        for _ in range(200):
            try:
                self.metrics()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("storeguard did not start: " + Path(self.log.name).read_text())

    def metrics(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mport}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("storeguard_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def total(self, prefix):
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def records(self):
        return audit_records(self.audit)

    def events(self):
        """The audit events that are findings: all but flow records and scan notices (flows)."""
        return [e for e in self.records() if e.get("event.action") not in RECORDS]

    def flows(self):
        """The flow records and scan notices."""
        return [e for e in self.records() if e.get("event.action") in RECORDS]

    def assert_clean(self):
        evs = self.events()
        assert not evs, f"false positives on real torch traffic: {evs}"
        # Every connection of real torch traffic is accounted for as passed, or as one that sent
        # nothing (torch <= 2.0's callback connection), or still open: none is a scan.
        bad = [e for e in self.flows() if e.get("event.action") == "scan_detected"
               or e.get("storeguard.verdict") not in ("passed", "empty", "open")]
        assert not bad, f"real torch traffic recorded as hostile: {bad}"
        assert self.total("storeguard_violations_total") == 0
        assert self.total("storeguard_panics_recovered_total") == 0


# Audit records that are no finding by themselves: a connection's account, and a scan notice.
RECORDS = ("flow", "scan_detected")


def audit_records(path):
    """Every record of the audit log at path: its passed connections' flows first (path.flows, which
    storeguard keeps apart; a long connection's interim records are there), then the log itself."""
    path = Path(path)
    out = []
    for p in (path.with_name(path.name + ".flows"), path):
        if p.exists():
            out += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return out


def run_py(version, *args, timeout=180, env=None):
    p = subprocess.run([ENVS[version], *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    return p


def last_json(out):
    for line in reversed(out.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


# --- every store operation, direct and through the guard ----------------------------------------

@pytest.mark.parametrize("generation", ["auto", "exact"])
@pytest.mark.parametrize("version,backend", COMBOS, ids=[f"{v}-{b}" for v, b in COMBOS])
def test_every_store_op_matches_direct(procs, binary, tmp_path, version, backend, generation):
    _, sport = start_store(procs, version, backend)
    guard = Guard(procs, binary, sport, "auto" if generation == "auto" else release(version), tmp_path)
    results = {}
    for name, port in (("direct", sport), ("guarded", guard.port)):
        args = [HERE / "workload.py", "127.0.0.1", port, "--role", "client", "--prefix", name]
        if minor(version) >= (2, 2):
            args += ["--use-libuv", "1" if backend == "libuv" else "0"]
        p = run_py(version, *args)
        res = last_json(p.stdout)
        assert p.returncode == 0 and res and res["ok"], f"{name}: rc={p.returncode} {p.stdout[-2000:]} {p.stderr[-2000:]}"
        results[name] = json.dumps(res["ops"]).replace(name, "PREFIX")
    assert results["guarded"] == results["direct"]
    assert len(json.loads(results["direct"])) >= 8
    guard.assert_clean()
    assert guard.total("storeguard_messages_total") > 10


# --- real jobs ----------------------------------------------------------------------------------

VERSIONS = list(ENVS)


@pytest.mark.parametrize("version", VERSIONS)
def test_gloo_job_world4_through_guard(procs, binary, tmp_path, version):
    """init_process_group(backend="gloo", init_method="tcp://GUARD") with world_size 4 in separate
    processes, as torchrun's agent-store mode runs it: every rank, rank 0 included, is a client of
    the store behind the guard. The guard starts before the store, as a sidecar does."""
    sport = free_port()
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    args = [HERE / "pg_job.py", "127.0.0.1", guard.port, "--rdzv", "agent", "--serve-store", sport, "--world-size", 4]
    if minor(version) >= (2, 2):
        args += ["--use-libuv", "1" if default_backend(version) == "libuv" else "0"]
    p = run_py(version, *args, timeout=240)
    res = last_json(p.stdout)
    assert p.returncode == 0 and res and res["ok"] and res["reduced"] == 10.0, f"{p.stdout[-3000:]} {p.stderr[-3000:]}"
    guard.assert_clean()
    assert guard.total("storeguard_connections_accepted_total") >= 4


@pytest.mark.parametrize("version", [v for v in VERSIONS if minor(v) >= (2, 0)])
def test_torchrun_c10d_rendezvous_through_guard(procs, binary, tmp_path, version):
    """torchrun --rdzv-backend c10d --rdzv-endpoint GUARD. (Debian's 1.13 torchrun does not run on
    Python 3.11; 2.0 covers G0.)"""
    sport = free_port()
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    args = [HERE / "pg_job.py", "127.0.0.1", guard.port, "--rdzv", "torchrun", "--serve-store", sport, "--world-size", 4]
    p = run_py(version, *args, timeout=300)
    res = last_json(p.stdout)
    assert p.returncode == 0 and res and res["ok"], f"{p.stdout[-3000:]} {p.stderr[-3000:]}"
    guard.assert_clean()
    assert guard.total("storeguard_messages_total") > 0
    # The ranks' own store is not the rendezvous endpoint (a TCPStore on a free port: the rank-0
    # agent's from 2.6, worker rank 0's before): the guard counts the round and logs where it went.
    ports = {r["worker_store"].rsplit(":", 1)[1] for r in res["ranks"]}
    assert len(ports) == 1 and ports != {str(guard.port)}, res["ranks"]
    assert guard.total("storeguard_unguarded_job_stores_total") == 1
    log = Path(guard.log.name).read_text()
    assert "sends its ranks to a store this guard does not front" in log and f"master_port={ports.pop()}" in log, log[-3000:]


# --- real attacks against a real store, while a benign client runs -------------------------------

def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def send(port, data, hold=0.0, source="127.0.0.1"):
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    try:
        s.sendall(data)
        if hold:
            time.sleep(hold)
        s.settimeout(2)
        try:
            return s.recv(64)
        except (socket.timeout, OSError):
            return None
    finally:
        s.close()


NMAP_106294 = bytes.fromhex("0300000b06e00000000000")  # nmap TerminalServer, 11 bytes

ATTACK_COMBOS = [(v, b) for v, b in COMBOS if (v, b) in {("1.13.1", "legacy"), ("2.6.0", "legacy"),
                                                         ("2.15.0", "libuv"), ("2.15.0", "legacy")}]


@pytest.mark.parametrize("version,backend", ATTACK_COMBOS, ids=[f"{v}-{b}" for v, b in ATTACK_COMBOS])
def test_attacks_blocked_while_job_runs(procs, binary, tmp_path, version, backend):
    store, sport = start_store(procs, version, backend)
    # Loopback is exempt from bans by default (the host's own ranks); here 127.0.0.9 stands for
    # another host. 127.0.0.1, where the job runs, runs the probe suite too: its violations ban it
    # like any source, but while it serves the job it is only throttled (ban.serving-rate) and the
    # job's live connection (the latency loop, 0 errors) is never touched.
    cfg = tmp_path / "no-exempt.yaml"
    cfg.write_text("ban:\n  exempt: []\n")
    guard = Guard(procs, binary, sport, release(version), tmp_path, extra=("--config", str(cfg)))
    rss0 = rss_kib(store.pid)
    loop = procs.start([ENVS[version], str(HERE / "latency_loop.py"), "127.0.0.1", str(guard.port), "10"])
    assert json.loads(loop.stdout.readline())["ready"]
    time.sleep(2)  # quiet seconds first

    # A partial message held open (first: before the probes below get their source banned).
    holder = socket.create_connection(("127.0.0.1", guard.port))
    holder.sendall(handshake(version) + bytes([1 if minor(version) >= (2, 2) else 0]) + (100).to_bytes(8, "little") + b"abc")
    # The probe suite, with the real 962 GB #106294 bytes: everything must be blocked.
    p = subprocess.run([binary, "probe", "--target", f"127.0.0.1:{guard.port}", "--generation", release(version),
                        "--real-106294", "--json"], capture_output=True, text=True, timeout=120)
    verdicts = [json.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == 0 and verdicts and all(v["verdict"] == "blocked" for v in verdicts), p.stdout + p.stderr
    # A flood of scanner probes, from another host.
    for _ in range(200):
        send(guard.port, NMAP_106294, source="127.0.0.9")
    time.sleep(1)
    holder.close()

    out, _ = loop.communicate(timeout=60)
    res = last_json(out)
    assert res and res["errors"] == 0 and res["ops"] > 0, out
    quiet, attacked = min(res["p50_per_second"][:2]), max(res["p50_per_second"][2:])
    # Not a benchmark: a frozen store shows as seconds, a working one as milliseconds.
    assert attacked < max(20 * quiet, 0.05), f"benign p50 {quiet * 1e3:.2f} ms quiet, {attacked * 1e3:.2f} ms under attack"
    growth = rss_kib(store.pid) - rss0
    assert growth < 64 * 1024, f"store RSS grew {growth} KiB"

    evs = guard.events()
    rules = {e["event.reason"] for e in evs}
    banned = {e["source.ip"] for e in evs if e["event.action"] == "banned"}
    assert "127.0.0.9" in banned and banned <= {"127.0.0.9", "127.0.0.1"}, \
        f"200 probes from one source must earn it a ban, and only the probing sources: {banned}"
    expected = {"key_too_long", "value_too_long", "too_many_keys", "unknown_opcode"}
    assert expected <= rules, f"audit rules {rules}"
    m = guard.metrics()
    assert m.get('storeguard_violations_total{mode="enforce",rule="key_too_long"}', 0) >= 1
    assert guard.total('storeguard_connections_refused_total{reason="banned"}') > 0
    assert guard.total("storeguard_panics_recovered_total") == 0


# --- the harm storeguard prevents, shown on an unguarded legacy store ---------------------------

HARM_COMBOS = [(v, "legacy") for v in ("1.13.1", "2.6.0") if v in ENVS]


def handshake(version):
    if minor(version) < (2, 2):
        return b""
    hs = bytes.fromhex("00cef7853c")
    return hs + bytes.fromhex("0d01000000") if minor(version) >= (2, 5) else hs


def numkeys_op(version):
    return bytes([6 if minor(version) < (2, 2) else 7])


@pytest.mark.parametrize("version,backend", HARM_COMBOS, ids=[f"{v}-{b}" for v, b in HARM_COMBOS])
def test_unguarded_legacy_store_is_harmed(procs, tmp_path, version, backend):
    """Documents what the guard prevents: on an unguarded legacy store a 17-byte CHECK makes the
    store allocate hundreds of MB, and a partial message freezes it for every client."""
    store, sport = start_store(procs, version, backend)
    check = bytes([4 if minor(version) < (2, 2) else 5]) + (1 << 24).to_bytes(8, "little")
    rss0 = rss_kib(store.pid)
    s = socket.create_connection(("127.0.0.1", sport))
    s.sendall(handshake(version) + check)
    jump, deadline = 0, time.monotonic() + 8
    while jump <= 100 * 1024 and time.monotonic() < deadline:  # the store zero-fills as it goes
        time.sleep(0.2)
        jump = max(jump, rss_kib(store.pid) - rss0)
    s.close()
    assert jump > 100 * 1024, f"expected the store to allocate for 2^24 keys; RSS grew {jump} KiB"

    holder = socket.create_connection(("127.0.0.1", sport))
    holder.sendall(handshake(version) + bytes([0 if minor(version) < (2, 2) else 1]) + (100).to_bytes(8, "little") + b"abc")
    time.sleep(0.2)
    c = socket.create_connection(("127.0.0.1", sport))
    c.sendall(handshake(version) + numkeys_op(version))
    c.settimeout(1.5)
    want = 8 + (4 if minor(version) >= (2, 5) else 0)
    with pytest.raises(socket.timeout):
        got = b""
        while len(got) < want:
            got += c.recv(64)
    holder.close()  # releases the store
    c.settimeout(5)
    got = b""
    while len(got) < want:
        chunk = c.recv(64)
        assert chunk, "store closed the benign client"
        got += chunk
    c.close()


@pytest.mark.parametrize("version,backend", HARM_COMBOS[:1], ids=[f"{v}-{b}" for v, b in HARM_COMBOS[:1]])
def test_unguarded_store_under_memory_cap(procs, version, backend):
    """The same store under a hard address-space cap (prlimit): a key length it cannot allocate resets
    the connection; one it can (a 1 GiB key) is committed while the master waits for its bytes."""
    port = free_port()
    p = procs.start(["prlimit", f"--as={6 << 30}", ENVS[version], str(HERE / "workload.py"), "127.0.0.1", str(port),
                     "--role", "master"])
    assert json.loads(p.stdout.readline())["ready"]
    rss0 = rss_kib(p.pid)
    assert send(port, b"\x00" + (8 << 30).to_bytes(8, "little")) in (b"", None)
    assert p.poll() is None, "the store died"
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"\x00" + (1 << 30).to_bytes(8, "little"))
    jump, deadline = 0, time.monotonic() + 12
    while jump <= 512 * 1024 and time.monotonic() < deadline:
        time.sleep(0.2)
        jump = max(jump, rss_kib(p.pid) - rss0)
    s.close()
    assert jump > 512 * 1024, f"a 1 GiB key length grew RSS only {jump} KiB"
