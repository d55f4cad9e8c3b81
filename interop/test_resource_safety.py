"""Nothing around the guard may stop it forwarding for a running job (issue #15), against real
torch stores of both backends, with storeguard's default configuration.
"""
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from test_interop import (ENVS, HERE, RECORDS, binary, free_port, handshake, minor, numkeys_op, procs, run_py,  # noqa: F401
                          start_store, wait_ready)

OLDEST = min(ENVS, key=minor)
NEWEST = max(ENVS, key=minor)
# A legacy store (the oldest release) and a libuv one (the newest).
STORES = [(OLDEST, "legacy"), (NEWEST, "libuv")]


def metric(mport, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return None


def pipe_bytes(f):
    """How many bytes wait unread in the pipe f reads from (FIONREAD), without reading them."""
    import array
    import fcntl
    import termios
    n = array.array("i", [0])
    fcntl.ioctl(f.fileno(), termios.FIONREAD, n)
    return n[0]


def metric_sum(mport, prefix):
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
        return sum(float(line.split()[-1]) for line in r.read().decode().splitlines() if line.startswith(prefix))


class Client:
    """A long-lived benign client speaking the release's protocol: handshake, then GETNUMKEYS."""

    def __init__(self, version, port, source="127.0.0.1", timeout=5):
        self.version = version
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.sock.sendall(handshake(version))
        if minor(version) >= (2, 5):
            self._recv(4)  # PING's nonce

    def _recv(self, n):
        got = b""
        while len(got) < n:
            chunk = self.sock.recv(n - len(got))
            assert chunk, "the guard closed a benign client"
            got += chunk
        return got

    def numkeys(self):
        self.sock.sendall(numkeys_op(self.version))
        return int.from_bytes(self._recv(8), "little")


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_a_stalled_log_sink_never_stops_forwarding(procs, binary, version, backend):  # noqa: F811
    """stderr (where audit events and logs go by default) is a pipe nobody reads, as with a stuck
    container log shim: hundreds of blocked probes fill it. A long-lived client's ops, and a new
    client from another source, must still be served; the lost events are counted."""
    store, sport = start_store(procs, version, backend)
    port, mport = free_port(), free_port()
    guard = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{sport}",
                              "--metrics-listen", f"127.0.0.1:{mport}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    procs.procs.append(guard)  # its stderr is never read
    wait_ready(mport, "storeguard")
    job = Client(version, port)
    job.numkeys()  # served
    # Blocked probes from 200 sources (a scan spread over a subnet; each under the ban threshold),
    # each an unknown opcode: one audit event apiece, 150 KB of events for a 64 KiB pipe.
    for i in range(400):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2,
                                          source_address=(f"127.0.1.{1 + i % 200}", 0)) as s:
                s.sendall(b"\xff")
        except OSError:
            pass
    for _ in range(6):
        t0 = time.monotonic()
        job.numkeys()
        assert time.monotonic() - t0 < 2, "a benign op waited on the stalled sink"
    other = Client(version, port, source="127.0.0.2")  # a new rank from another host: accepted, served
    other.numkeys()
    assert guard.poll() is None
    # The sink was stalled all along: the pipe is full (its 64 KiB, never read), far less than the
    # events, and nothing was read from it.
    stalled = pipe_bytes(guard.stderr)
    blocked = metric_sum(mport, "storeguard_violations_total{")
    assert blocked >= 300 and 40 * 1024 <= stalled < 100 * 1024 < blocked * 400, (blocked, stalled)


def raise_nofile():
    """The guard's soft descriptor limit up to the hard one, as its systemd unit sets it: the tests
    hold over a thousand client connections through it."""
    import resource
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_guard(procs, binary, sport, tmp_path, *extra, nofile=None):  # noqa: F811
    """storeguard serve in front of the store at sport; nofile: its descriptor limit, soft and hard
    (else its soft limit is raised to the hard one)."""
    port, mport = free_port(), free_port()
    limit = raise_nofile
    if nofile:
        import resource
        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    log = open(tmp_path / f"guard-{port}.log", "w")
    p = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{sport}",
                          "--metrics-listen", f"127.0.0.1:{mport}", "--audit-log", str(tmp_path / f"audit-{port}.jsonl"),
                          *extra], stdout=log, stderr=log, start_new_session=True, preexec_fn=limit)
    procs.procs.append(p)
    wait_ready(mport, "storeguard")
    return p, port, mport


def no_quota(tmp_path):
    """serve's arguments for a guard without the store quota: the floods of distinct 8 MiB keys below test the
    buffer budget, and past quota.store-bytes (1 GiB in all, 256 MiB a source) the quota refuses them, as it
    should (interop/test_valid_traffic.py)."""
    path = tmp_path / "no-quota.yaml"
    path.write_text("quota:\n  mode: off\n")
    return ("--config", str(path))


def test_idle_connections_cost_the_store_nothing(procs, binary, tmp_path):  # noqa: F811
    """torch 1.13's store with the usual soft RLIMIT_NOFILE of 1024: 1,100 idle connections through
    the guard (paced under the per-source rate) used to be 1,100 store connections, and the store
    aborted on EMFILE, killing rank 0. A connection that has sent nothing must cost the store
    nothing: the store lives, and a rank is served."""
    version = OLDEST
    raise_nofile()  # this test holds 1,100 sockets itself
    store, sport = start_store(procs, version, "legacy", nofile=1024)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    own = len(store_connections(store.pid))  # the master's own client connections
    idle = []
    for i in range(1100):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass  # refused by the caps: fine
        time.sleep(1 / 150)
    time.sleep(1)
    assert store.poll() is None, f"the store died: {store.stderr.read()[-2000:]}"
    assert len(store_connections(store.pid)) == own, "idle clients hold store connections"
    job = Client(version, port, source="127.0.0.2")  # another host: the idle flood filled 127.0.0.1's cap
    job.numkeys()
    assert store.poll() is None
    for s in idle:
        s.close()


@pytest.mark.parametrize("sources", [1, 11])
def test_valid_first_messages_cannot_exhaust_the_store(procs, binary, tmp_path, sources):  # noqa: F811
    """The same store (torch 1.13, soft RLIMIT_NOFILE 1024), but each of 1,100 connections sends one
    valid GETNUMKEYS and stays open: a valid message earns a store connection, and 1,010 of them
    were enough for EMFILE and the store's abort. Store connections are capped below what the store
    can hold: per source (one host's flood leaves room for the other hosts' ranks, served while it
    holds), and in all (a flood spread over 11 sources is held at the store's descriptor limit,
    read from /proc). Once the flood closes, its store connections are given back: a rank is
    served."""
    version = OLDEST
    raise_nofile()
    store, sport = start_store(procs, version, "legacy", nofile=1024)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    flood = []
    for i in range(1100):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5,
                                         source_address=(f"127.0.2.{1 + i % sources}", 0))
            s.sendall(numkeys_op(version))
            flood.append(s)
        except OSError:
            pass  # refused by the caps: fine
        time.sleep(1 / 150)
    time.sleep(2)
    assert store.poll() is None, f"the store died: {store.stderr.read()[-2000:]}"
    held = len(store_connections(store.pid))
    limit = metric(mport, "storeguard_store_connections_limit")
    assert metric(mport, "storeguard_store_connections") <= limit < 1024, (limit, held)
    if sources == 1:
        job = Client(version, port, source="127.0.0.3")  # another host, under its own cap
        job.numkeys()
        assert metric(mport, "storeguard_store_connections") < limit, "one source filled the store"
    for s in flood:
        s.close()
    for _ in range(100):
        if metric(mport, "storeguard_store_connections") <= (1 if sources == 1 else 0):
            break
        time.sleep(0.1)
    late = Client(version, port, source="127.0.0.4")
    late.numkeys()
    assert store.poll() is None


def store_connections(pid):
    """The established TCP connections the store process has (its sockets in /proc)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.parametrize("backend", ["libuv", "legacy"])
def test_connection_churn_does_not_delay_a_new_rank(procs, binary, tmp_path, backend):  # noqa: F811
    """torch 2.15's store accepts about 10 connections a second (it resolves each peer's name): 8 s
    of connect-and-close churn at 150/s through the guard made a new rank's first op wait 99 s.
    Connections that send nothing must not reach the store."""
    version = NEWEST
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    end = time.monotonic() + 8
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        except OSError:
            pass
        time.sleep(1 / 150)
    t0 = time.monotonic()
    Client(version, port).numkeys()
    took = time.monotonic() - t0
    assert took < 2, f"a new rank's first op took {took:.1f} s behind the churn"


def first_op(version, port, source):
    """Seconds from connecting to the answer of a new rank's first op (its handshake and GETNUMKEYS)."""
    t0 = time.monotonic()
    Client(version, port, source=source, timeout=60).numkeys()
    return time.monotonic() - t0


def churn_one_message(version, port, source, rate, seconds, during=(), sample_every=30):
    """Connections from source at rate a second for seconds, each sending one valid GETNUMKEYS
    (after the handshake) and closing at once; every sample_every-th waits for its answer on a
    thread instead. Calls each of during (offset in seconds, function) once the churn is that far.
    Returns the sampled connections' outcomes: "answered", "closed" (by the guard, before an
    answer) or what else happened."""
    import threading
    outcomes, threads = [], []

    def sampled(s):
        try:
            got = s.recv(8)
            outcomes.append("answered" if len(got) == 8 else "closed")
        except ConnectionResetError:
            outcomes.append("closed")
        except OSError as e:
            outcomes.append(repr(e))
        finally:
            s.close()

    msg = handshake(version) + numkeys_op(version)
    pending = sorted(during)
    start = time.monotonic()
    for i in range(int(rate * seconds)):
        while pending and time.monotonic() - start >= pending[0][0]:
            threads.append(threading.Thread(target=pending.pop(0)[1]))
            threads[-1].start()
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
            s.sendall(msg)
            if i % sample_every == 0:
                threads.append(threading.Thread(target=sampled, args=(s,)))
                threads[-1].start()
            else:
                s.close()
        except OSError:
            pass  # refused at accept by the per-source caps: fine
        time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    for t in threads:
        t.join(120)
    return outcomes


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_one_message_churn_does_not_delay_a_new_rank(procs, binary, tmp_path, version, backend):  # noqa: F811
    """One host opens 150 connections a second for 8 s, each sending one valid GETNUMKEYS and
    closing: each was a store connection, and torch 2.6+ stores resolve every new peer's name in
    the thread that serves all clients (here about 50 lookups at once, 60 a second, then one takes
    5 s), so a new rank from another host waited 9.5 s for its first op during the churn and 29 s
    after it. The guard dials the store at caps.per-source-store-dial-rate for the churning host,
    and a new host's rank goes first: its first op is served at once (measured: 1 to 4 ms), during
    the churn and after it. The churn's own connections are answered or closed by the guard, never
    as a violation (timeouts.upstream-dial is 5 s here, so that its waiters give up within the
    test)."""
    store, sport = start_store(procs, version, backend)
    cfg = tmp_path / "dial.yaml"
    cfg.write_text("timeouts:\n  upstream-dial: 5s\n")
    guard, port, mport = start_guard(procs, binary, sport, tmp_path, "--config", str(cfg))
    took = {}

    def rank(label):
        return lambda: took.__setitem__(label, first_op(version, port, "127.0.0.9"))

    outcomes = churn_one_message(version, port, "127.0.0.5", 150, 8, during=[(2, rank("at 2 s")), (6, rank("at 6 s"))])
    took["after"] = first_op(version, port, "127.0.0.10")
    slow = {k: round(v, 3) for k, v in took.items() if v > 1}
    assert len(took) == 3 and not slow, f"a new rank's first op (s): {took}"
    assert outcomes and set(outcomes) <= {"answered", "closed"}, outcomes
    assert "answered" in outcomes, "no churning connection was ever served"
    assert metric_sum(mport, "storeguard_store_connection_waits_total{") > 0
    assert metric_sum(mport, "storeguard_violations_total{") == 0
    assert store.poll() is None


JOB_START = r"""
import datetime, json, sys, threading, time
import torch.distributed as dist
port, n = int(sys.argv[1]), int(sys.argv[2])
go, took, errors = threading.Barrier(n), [0.0] * n, []
def rank(r):
    try:
        go.wait()
        t0 = time.monotonic()
        s = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60), wait_for_workers=False)
        if s.add("start/arrived", 1) == n:
            s.set("start/go", "1")
        s.wait(["start/go"])
        took[r] = time.monotonic() - t0
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"slowest": max(took), "errors": errors}))
"""


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_a_jobs_start_is_not_paced(procs, binary, tmp_path, version, backend):  # noqa: F811
    """32 ranks of one host start at once (torch's own TCPStore clients, each ADDing itself and
    WAITing for the last): within caps.per-source-store-dial-burst, so no store dial of theirs
    waits for a token of their host's, and none is refused. (A dial may wait for the store's pace:
    with this machine's resolver, 32 lookups at once can stall a 2.6+ store for 5 s, and the pacer
    then holds the rest back until it answers again.)"""
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    p = run_py(version, "-c", JOB_START, port, 32, timeout=120)
    res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
    assert res and not res["errors"], f"{p.stdout[-2000:]} {p.stderr[-2000:]}"
    assert metric(mport, 'storeguard_store_connection_waits_total{reason="source_store_dial_rate"}') == 0, \
        "a rank's store dial waited for its host's dial rate"
    assert metric_sum(mport, "storeguard_store_connections_refused_total{") == 0, "a rank was refused a store connection"
    assert metric(mport, "storeguard_connections_accepted_total") >= 32, "the ranks did not go through the guard"


LARGE_JOB = 8000


@pytest.mark.skipif("2.4.1" not in ENVS, reason="torch 2.4.1 not installed")
def test_a_large_jobs_start_goes_through_the_defaults(procs, binary, tmp_path):  # noqa: F811
    """8,000 ranks, 8 a host (1,000 loopback sources), each ADDing itself and WAITing for the last
    (`storeguard bench --op rendezvous --per-host 8`), through the embedded defaults against a real
    torch 2.4.1 libuv store. The fixed store dial rate (100 a second, 512 at once) released none of
    them: those still waiting at timeouts.upstream-dial were closed. Paced by the store's answers,
    every one is released, none refused. (2.4.1 resolves no peer names, so this machine's resolver
    is not in the way; docs/benchmarks-scale.md has 2.15 and 1.13.)"""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 2 * LARGE_JOB + 1000:
        pytest.skip(f"a descriptor limit of {hard} holds no {LARGE_JOB} proxied connections")
    store, sport = start_store(procs, "2.4.1", "libuv", nofile=hard)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    p = subprocess.run([binary, "bench", "--addr", f"127.0.0.1:{port}", "--op", "rendezvous", "--conns", str(LARGE_JOB),
                        "--per-host", "8", "--generation", "2.4", "--timeout", "120s", "--json"],
                       capture_output=True, text=True, timeout=200, preexec_fn=raise_nofile)
    r = json.loads(p.stdout)["rendezvous"] if p.stdout.strip() else None
    assert r and r["completed"] == LARGE_JOB, f"{r} {p.stderr[-2000:]}"
    assert metric_sum(mport, "storeguard_store_connections_refused_total{") == 0, "a rank was refused a store connection"
    assert metric_sum(mport, "storeguard_violations_total{") == 0


# In a network namespace of its own (loopback only): a store that listens while net.core.somaxconn
# is 128 (Linux before 5.4, and RHEL 8's 4.18, which clusters still run, cap torch's listen backlog
# there), then a guard that listens after it is raised (its own accept queue is not the one
# measured); each start, direct and through the guard, counts the SYNs the kernel dropped for a full
# accept queue (TcpExtListenOverflows, per namespace). Prints one JSON line a start.
SMALL_BACKLOG_START = r"""
set -u
ip link set lo up
overflows() { awk '/^TcpExt:/ { if (!h) { split($0, k); h = 1 } else for (i = 2; i <= NF; i++) if (k[i] == "ListenOverflows") print $i }' /proc/net/netstat; }
sysctl -qw net.core.somaxconn=128
"$STORE_PY" "$TORCHSTORE" "$SPORT" "$BACKEND" >"$OUT/store.log" 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for _ in $(seq 300); do grep -q ready "$OUT/store.log" && break; sleep 0.1; done
sysctl -qw net.core.somaxconn=4096
"$SG" serve --listen "127.0.0.1:$GPORT" --upstream "127.0.0.1:$SPORT" --metrics-listen "127.0.0.1:$MPORT" \
	--audit-log "$OUT/audit.jsonl" >"$OUT/guard.log" 2>&1 &
for _ in $(seq 300); do curl -sf "127.0.0.1:$MPORT/readyz" >/dev/null && break; sleep 0.1; done
for t in direct:$SPORT guard:$GPORT; do
	o=$(overflows)
	r=$("$SG" bench --addr "127.0.0.1:${t#*:}" --op rendezvous --conns "$N" --per-host 8 --generation "$GEN" --timeout 60s --json | tr -d '\n')
	printf '{"target": "%s", "overflows": %d, "run": %s}\n' "${t%%:*}" "$(($(overflows) - o))" "${r:-null}"
done
curl -s "127.0.0.1:$MPORT/metrics" | awk '/^storeguard_(violations_total|store_connections_refused_total)\{/ {s += $2} END {print "{\"refused_or_violations\": " s + 0 "}"}'
"""


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_a_start_does_not_overflow_the_stores_accept_queue(binary, tmp_path, version, backend):  # noqa: F811
    """The pacing window grew without bound (31,000 in a start of 8,000 ranks against torch 1.13's
    legacy store), past the store's accept queue (its listen backlog: 2,048 there): the kernel
    dropped the SYNs past it, 4,100 to 14,700 a start through the guard (770 to 1,800 direct), and each
    waited out a retransmission of 1 s and more. The window now stays within the backlog, read by
    sock_diag. On a host whose somaxconn is 128 (kernels before 5.4), 1,000 ranks at once overflow
    the store's queue direct; through the guard none is dropped, the start completes, and no rank is
    refused."""
    gen = "%d.%d" % minor(version)
    env = dict(os.environ, SG=binary, STORE_PY=ENVS[version], TORCHSTORE=str(HERE.parent / "bench" / "torchstore.py"),
               BACKEND="default" if minor(version) < (2, 2) else backend, OUT=str(tmp_path),
               SPORT="29511", GPORT="29512", MPORT="29513", N="1000", GEN=gen)
    p = subprocess.run(["unshare", "-n", "bash", "-c", SMALL_BACKLOG_START], env=env, capture_output=True, text=True,
                       timeout=300, preexec_fn=raise_nofile)
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    starts = {r["target"]: r for r in lines if "target" in r}
    assert set(starts) == {"direct", "guard"}, f"{p.stdout[-2000:]} {p.stderr[-2000:]}"
    for t, r in starts.items():
        assert r["run"] and r["run"]["rendezvous"]["completed"] == 1000, f"{t}: {r} {p.stderr[-2000:]}"
    said = {t: (r["overflows"], r["run"]["rendezvous"]["total_s"]) for t, r in starts.items()}  # dropped SYNs, seconds
    if backend == "legacy":  # it accepts one connection a poll over all of them
        assert starts["direct"]["overflows"] > 0, f"1,000 ranks direct did not overflow a backlog of 128: {said}"
    assert starts["guard"]["overflows"] == 0, f"the guard's dials overflowed the store's accept queue: {said}"
    assert lines[-1] == {"refused_or_violations": 0}, lines[-1]


def test_a_start_within_the_stores_accept_queue_waits_for_nothing(procs, binary, tmp_path):  # noqa: F811
    """Pacing started at a window of 512 store dials in flight, and a start of 2,000 ranks against
    torch 1.13's legacy store (its accept queue: 2,048) waited for the window to grow: 313 ranks in a
    fresh guard's first start, about 95 in each after, each handed from its event loop to goroutines
    and back. The first window is now the
    store's accept queue, what the store takes at once from ranks that dial it directly: a start
    within it waits for nothing, and every rank is released."""
    somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
    backlog = min(2048, somaxconn)  # torch 1.13 listens with 2,048; the kernel caps it at somaxconn
    n = min(2000, backlog)
    store, sport = start_store(procs, OLDEST, "legacy")
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    deadline = time.monotonic() + 15  # the guard reads the store's listening socket as it starts
    while metric(mport, 'storeguard_store_pacing{value="window"}') != backlog and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(mport, 'storeguard_store_pacing{value="window"}') == backlog, \
        "the first window is not the store's accept queue"
    p = subprocess.run([binary, "bench", "--addr", f"127.0.0.1:{port}", "--op", "rendezvous", "--conns", str(n),
                        "--per-host", "8", "--generation", "1.13", "--timeout", "60s", "--json"],
                       capture_output=True, text=True, timeout=120, preexec_fn=raise_nofile)
    r = json.loads(p.stdout)["rendezvous"] if p.stdout.strip() else {"stderr": p.stderr[-2000:]}
    assert r.get("completed") == n, r
    waits = metric_sum(mport, 'storeguard_store_connection_waits_total{reason="store_pacing"}')
    assert waits == 0, f"{waits:.0f} of {n} ranks waited for the pacing window, within the store's accept queue"
    assert metric_sum(mport, 'storeguard_event_loop_handbacks_total{reason="dial"}') == 0
    assert metric_sum(mport, "storeguard_store_connections_refused_total") == 0
    assert metric_sum(mport, "storeguard_violations_total{") == 0


def test_the_connection_cap_follows_the_guards_descriptor_limit(procs, binary, tmp_path):  # noqa: F811
    """caps.max-connections was 20,000 whatever the guard's descriptor limit: on a cluster's node
    (a hard limit of 524,288 or 1,048,576) it refused a job past about 19,000 ranks that the store
    held, and under a limit below 40,000 the guard ran out of descriptors first (failed accepts,
    nothing named). auto is half the limit less a reserve of 256: a guard limited to 1,000
    descriptors holds 372. A start of 360 ranks through it completes; one of 480 is refused past the
    cap, by name (max_connections), with no failed accept. (auto per-prefix-connections, half of
    that, is lifted: the bench's hosts share one /24.)"""
    store, sport = start_store(procs, "2.4.1", "libuv", nofile=4096)
    cfg = tmp_path / "no-prefix-cap.yaml"
    cfg.write_text("caps:\n  per-prefix-connections: 0\n")  # the bench's 60 hosts share one /24
    guard, port, mport = start_guard(procs, binary, sport, tmp_path, "--config", str(cfg), nofile=1000)

    def start(n):
        p = subprocess.run([binary, "bench", "--addr", f"127.0.0.1:{port}", "--op", "rendezvous", "--conns", str(n),
                            "--per-host", "8", "--generation", "2.4", "--timeout", "20s", "--json"],
                           capture_output=True, text=True, timeout=120, preexec_fn=raise_nofile)
        return json.loads(p.stdout)["rendezvous"] if p.stdout.strip() else {"stderr": p.stderr[-2000:]}

    r = start(360)
    assert r.get("completed") == 360, r
    assert metric_sum(mport, 'storeguard_connections_refused_total{reason="max_connections"}') == 0
    start(480)
    assert metric_sum(mport, 'storeguard_connections_refused_total{reason="max_connections"}') > 0, \
        "480 connections at once were not refused at caps.max-connections (auto: 372)"
    assert metric_sum(mport, "storeguard_accept_errors_total") == 0, "the guard ran out of descriptors"
    assert metric_sum(mport, "storeguard_violations_total{") == 0


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_a_scan_from_the_jobs_address_does_not_lock_out_new_ranks(procs, binary, tmp_path, version, backend):  # noqa: F811
    """A security agent scans localhost while a job runs through the guard from localhost: the
    scan used to ban 127.0.0.1 for 10 minutes, and new ranks (an elastic restart) failed. The scan's
    messages are still refused one by one; a real torch client joining afterwards runs every op."""
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    job = Client(version, port)  # a rank of the running job
    job.numkeys()
    for _ in range(20):  # nmap -sV's probes, each a violation
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(bytes.fromhex("0300000b06e00000000000"))
                s.recv(1)
        except OSError:
            pass
    args = [str(HERE / "workload.py"), "127.0.0.1", port, "--role", "client", "--prefix", "late"]
    if minor(version) >= (2, 2):
        args += ["--use-libuv", "1" if backend == "libuv" else "0"]
    p = run_py(version, *args, timeout=120)
    assert p.returncode == 0, f"a new rank failed after the scan: {p.stdout[-2000:]} {p.stderr[-2000:]}"
    job.numkeys()
    assert metric_sum(mport, "storeguard_violations_total{") == 20, "every probe is still refused and counted"


def set_op(version, key, value_len):
    """A SET's header (opcode, key, value length) as the release puts it on the wire."""
    op = 0 if minor(version) < (2, 2) else 1
    return bytes([op]) + len(key).to_bytes(8, "little") + key + value_len.to_bytes(8, "little")


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_one_source_cannot_starve_the_buffer_budget(procs, binary, tmp_path, version, backend):  # noqa: F811
    """40 connections from one host each hold a partial SET of 8 MiB - 4 KiB: that pinned the whole
    default 256 MiB budget, and a benign 1 MiB SET from another host took 14.6 s (or was killed as
    message_timeout). Its share is 64 MiB now: the benign SET goes through at once."""
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    import threading
    held = []

    def pin(i):  # blocks once the guard stops reading it: on a thread of its own
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        held.append(s)
        try:
            s.sendall(handshake(version) + set_op(version, b"pin%d" % i, 8 << 20) + bytes((8 << 20) - 4096 - 64))
        except OSError:
            pass

    for i in range(40):
        threading.Thread(target=pin, args=(i,), daemon=True).start()
    time.sleep(3)
    job = Client(version, port, source="127.0.0.2")
    t0 = time.monotonic()
    job.sock.sendall(set_op(version, b"benign", 1 << 20) + bytes(1 << 20))
    job.numkeys()  # answered after the SET: the SET reached the store
    took = time.monotonic() - t0
    assert took < 2, f"a benign 1 MiB SET took {took:.1f} s behind one host's stalled messages"
    for s in held:
        s.close()


@pytest.mark.parametrize("version,backend", [(NEWEST, "libuv")], ids=[f"{NEWEST}-libuv"])
def test_large_values_from_many_ranks_complete(procs, binary, tmp_path, version, backend):  # noqa: F811
    """Valid 8 MiB SETs on 96 connections at once (more than the budget holds): every one completes,
    none is a violation. Waiting for budget is never the client's fault: 40 of 96 such connections
    were killed as message_timeout before."""
    import threading
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path, *no_quota(tmp_path))
    errors = []

    def rank(i):
        try:
            # A torch 2.x store accepts about 10 connections a second where names do not resolve:
            # 96 handshakes at once may take it ten seconds.
            c = Client(version, port, timeout=60)
            c.sock.sendall(set_op(version, b"v%d" % i, 8 << 20) + bytes(8 << 20))
            c.numkeys()
        except Exception as e:  # noqa: BLE001
            errors.append(f"rank {i}: {e!r}")

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(96)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:5]
    assert metric_sum(mport, "storeguard_violations_total{") == 0


def get_op(version, key):
    op = 2 if minor(version) < (2, 2) else 3
    return bytes([op]) + len(key).to_bytes(8, "little") + key


UNREAD = [(OLDEST, "legacy"), (NEWEST, "legacy"), (NEWEST, "libuv")]


@pytest.mark.parametrize("version,backend", UNREAD, ids=[f"{v}-{b}" for v, b in UNREAD])
def test_replies_nobody_reads_harm_neither_store_nor_job(procs, binary, tmp_path, version, backend):  # noqa: F811
    """One legal value of 8 MiB - 1 KiB, then 100 GETs of it pipelined on one connection (about 2 KB)
    and never read: a legacy store froze in send (0 benign ops in 8 s) and a libuv store grew by
    820 MB, one reply per GET. The guard drains the store's replies into a bounded buffer, holds a
    client's further requests while two await replies, and closes the client that does not read
    (rule replies_unread): the store's RSS stays flat and a rank's ops stay fast."""
    from test_interop import rss_kib
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    job = Client(version, port, source="127.0.0.2")
    job.numkeys()
    before = rss_kib(store.pid)
    size = (8 << 20) - 1024
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.9", 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that does not read
    s.sendall(handshake(version) + set_op(version, b"/big", size) + bytes(size))
    if minor(version) >= (2, 5):
        assert len(s.recv(4)) == 4  # PING's nonce; nothing else is ever read
    s.sendall(get_op(version, b"/big") * 100)
    ops, slow, peak = 0, [], before
    end = time.monotonic() + 8
    while time.monotonic() < end:
        t0 = time.monotonic()
        job.numkeys()
        took = time.monotonic() - t0
        ops += 1
        if took > 1:
            slow.append(round(took, 1))
        peak = max(peak, rss_kib(store.pid))
    assert not slow and ops > 50, f"benign ops behind unread replies: {ops} in 8 s, slow: {slow}"
    assert store.poll() is None
    grew = (peak - before) // 1024
    assert grew < 100, f"the store grew by {grew} MB holding replies nobody reads"
    deadline = time.monotonic() + 15
    while metric_sum(mport, 'storeguard_violations_total{mode="enforce",rule="replies_unread"') < 1:
        assert time.monotonic() < deadline, "the client that does not read its replies was never closed"
        time.sleep(0.2)
    s.close()
    job.numkeys()


@pytest.mark.parametrize("version,backend", [(NEWEST, "legacy"), (NEWEST, "libuv")], ids=["legacy", "libuv"])
def test_large_replies_read_slowly_and_cancelled_waits_pass(procs, binary, tmp_path, version, backend):  # noqa: F811
    """What a rank legitimately does with replies: reads 8 MiB values (slowly, a chunk at a time),
    times out in wait (WAIT, then CANCEL_WAIT while it is pending) and goes on. None of it is a
    violation, and every reply arrives whole."""
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    code = f"""
import datetime, sys, time, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", {port}, is_master=False, timeout=datetime.timedelta(seconds=30),
                  use_libuv={backend == "libuv"})
v = bytes(range(256)) * ((8 << 20) // 256)
s.set("big", v)
for _ in range(5):
    assert s.get("big") == v
for _ in range(3):
    try:
        s.wait(["absent"], datetime.timedelta(milliseconds=300))
        sys.exit("wait returned")
    except Exception:
        pass
    s.set("k", "1")
    assert s.get("k") == b"1"
print("ok")
"""
    p = run_py(version, "-c", code, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]
    # A slow reader: 8 MiB taken 64 KiB at a time, 5 ms apart (1.6 s), is never closed.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(handshake(version))
    if minor(version) >= (2, 5):
        s.recv(4)
    s.sendall(get_op(version, b"/big"))
    got = 0
    want = 8 + (8 << 20)
    while got < want:
        chunk = s.recv(min(65536, want - got))
        assert chunk, "the guard closed a slow reader"
        got += len(chunk)
        time.sleep(0.005)
    s.close()
    assert metric_sum(mport, "storeguard_violations_total{") == 0


def peak_rss_mib(pid):
    from pathlib import Path
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


@pytest.mark.parametrize("backend", ["legacy", "libuv"])
@pytest.mark.parametrize("conns,sets", [(16, 8), (96, 3)], ids=["16x8", "96x3"])
def test_guard_memory_stays_within_the_budget(procs, binary, tmp_path, conns, sets, backend):  # noqa: F811
    """Floods of valid 8 MiB SETs with the default 256 MiB budget: the guard's peak RSS was 505 MB
    (16 connections x 8 SETs) and 743-821 MB (96 x 3, 64 x 3): the event loops copied what the store
    could not take at once outside the budget, and the heap grew to twice what was live. Every
    buffered byte is in the budget now, and the heap is held to it (docs/design.md, Memory): peak
    RSS at most the budget plus 160 MiB (the heap's limit is the budget plus 96 MiB)."""
    import threading
    version = NEWEST
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path, *no_quota(tmp_path))
    errors = []
    value = bytes(8 << 20)

    def rank(i):
        try:
            c = Client(version, port, source=f"127.0.2.{1 + i % 32}", timeout=120)  # 32 hosts: the global budget
            for k in range(sets):
                c.sock.sendall(set_op(version, b"m%d-%d" % (i, k), len(value)) + value)
            c.numkeys()
        except Exception as e:  # noqa: BLE001
            errors.append(f"rank {i}: {e!r}")

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    peak = peak_rss_mib(guard.pid)
    print(f"guard peak RSS {peak} MiB for {conns} x {sets} SETs of 8 MiB")
    assert not errors, errors[:5]
    assert peak <= 256 + 160, f"guard peak RSS {peak} MiB for a 256 MiB budget"


# A real torch client sets a value and reads it back: argv HOST PORT SIZE USE_LIBUV ("" on releases
# without the flag). Prints {"same": bool, "len": n} or {"error": "..."}.
LARGE_VALUE_CLIENT = r"""
import datetime, json, sys
import torch.distributed as dist
host, port, size, use_libuv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kw = {"use_libuv": use_libuv == "1"} if use_libuv else {}
try:
    st = dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=30), wait_for_workers=False, **kw)
    value = bytes(range(256)) * (size // 256)
    st.set("large", value)
    got = st.get("large")
    print(json.dumps({"same": got == value, "len": len(got)}))
except Exception as e:  # noqa: BLE001
    print(json.dumps({"error": repr(e)}))
"""


def large_value(version, port, size, backend):
    flag = ("1" if backend == "libuv" else "0") if minor(version) >= (2, 2) else ""
    p = run_py(version, "-c", LARGE_VALUE_CLIENT, "127.0.0.1", port, size, flag, timeout=120)
    return json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"error": p.stderr[-2000:]}


def audit_events(tmp_path, port, want=0):
    """The guard's audit events, waiting up to 10 s for at least want of them (written off its
    forwarding path, through a queue)."""
    f = tmp_path / f"audit-{port}.jsonl"
    for _ in range(200):
        evs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []
        evs = [e for e in evs if e.get("event.action") not in RECORDS]  # findings only
        if len(evs) >= want:
            return evs
        time.sleep(0.05)
    return evs


LEGACY_STORES = [(OLDEST, "legacy"), (NEWEST, "legacy")]


@pytest.mark.parametrize("version,backend", LEGACY_STORES, ids=[f"{v}-{b}" for v, b in LEGACY_STORES])
def test_a_legacy_store_takes_a_32_mib_value_by_default(procs, binary, tmp_path, version, backend):  # noqa: F811
    """The legacy store (torch 1.13-2.1, and 2.2+ with use_libuv=False) has no value limit of its
    own, and jobs on it set values over libuv's 8 MiB: with the default configuration the guard cut
    such a job off (value_too_long at 8 MiB). A 32 MiB value is set and read back through it."""
    store, sport = start_store(procs, version, backend)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    got = large_value(version, port, 32 << 20, backend)
    assert got == {"same": True, "len": 32 << 20}, (got, audit_events(tmp_path, port))
    assert metric_sum(mport, "storeguard_violations_total{") == 0


def test_a_libuv_store_still_gets_no_value_over_8_mib(procs, binary, tmp_path):  # noqa: F811
    """libuv's own limit is 8 MiB (MAX_PAYLOAD_LEN: it closes the connection at a longer value's
    length), so the default configuration keeps it for a libuv store: a 9 MiB value is refused by
    the guard, on its length, and the store never sees it."""
    version = NEWEST
    store, sport = start_store(procs, version, "libuv")
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    got = large_value(version, port, 9 << 20, "libuv")
    assert "error" in got, got
    evs = audit_events(tmp_path, port, want=1)
    assert [(e["event.reason"], e["storeguard.declared"], e["storeguard.limit"]) for e in evs] == \
        [("value_too_long", str(9 << 20), str(8 << 20))], evs
    direct = run_py(version, "-c", "import datetime, sys, torch.distributed as d; "
                    "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), None, False, datetime.timedelta(seconds=10), "
                    "wait_for_workers=False); print(s.check(['large']))", sport, timeout=60)
    assert direct.stdout.strip() == "False", (direct.stdout, direct.stderr[-2000:])


def test_a_torch_1_13_client_goes_on_after_a_wait_timeout(procs, binary, tmp_path):  # noqa: F811
    """torch 1.13 has no CANCEL_WAIT: after wait() times out the client just sends its next requests,
    the WAIT still unanswered at the store. The guard must not count that WAIT as awaited for good
    (its next messages would wait at limits.max-pending-replies): every later op is served at once."""
    version = OLDEST
    store, sport = start_store(procs, version, "legacy")
    guard, port, mport = start_guard(procs, binary, sport, tmp_path)
    code = f"""
import datetime, time, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", {port}, is_master=False, timeout=datetime.timedelta(seconds=30))
for i in range(3):
    try:
        s.wait(["absent%d" % i], datetime.timedelta(milliseconds=300))
        raise SystemExit("wait returned")
    except RuntimeError:
        pass
    t0 = time.monotonic()
    for k in range(5):
        s.set("k%d" % k, str(k))
        assert s.get("k%d" % k) == str(k).encode()
        assert s.add("n", 1) == i * 5 + k + 1
    took = time.monotonic() - t0
    assert took < 2, took
print("ok")
"""
    p = run_py(version, "-c", code, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]
    assert metric_sum(mport, "storeguard_violations_total{") == 0
    assert metric_sum(mport, "storeguard_reply_resyncs_total") == 0


class DNSCounter:
    """A DNS server on addr:53 that answers every query at once with NXDOMAIN and keeps the names asked."""

    def __init__(self, addr):
        import threading
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((addr, 53))
        self.sock.settimeout(0.1)
        self.names, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                q, peer = self.sock.recvfrom(512)
            except socket.timeout:
                continue
            if len(q) < 12:
                continue
            i, labels = 12, []
            while i < len(q) and q[i]:
                labels.append(q[i + 1:i + 1 + q[i]].decode(errors="replace"))
                i += 1 + q[i]
            self.names.append(".".join(labels))
            question = q[12:i + 5]
            self.sock.sendto(q[:2] + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question, peer)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def with_hosts_and_resolver(tmp_path, nameserver):
    """A store command's wrapper: the store runs in its own mount namespace, whose /etc/hosts is a
    Debian's or a Kubernetes pod's (127.0.0.1 and ::1 named localhost; this machine's names no ::1)
    and whose resolver is nameserver."""
    hosts, resolv = tmp_path / "hosts", tmp_path / "resolv.conf"
    hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    resolv.write_text(f"nameserver {nameserver}\noptions timeout:1 attempts:1\n")
    nss = tmp_path / "nsswitch.conf"
    nss.write_text("hosts: files dns\n")
    return lambda cmd: ["unshare", "-m", "sh", "-c", f"mount --bind {hosts} /etc/hosts && mount --bind {resolv} "
                        f"/etc/resolv.conf && mount --bind {nss} /etc/nsswitch.conf && exec \"$@\"", "store", *cmd]


RESOLVING = [v for v in ENVS if minor(v) >= (2, 6)]


@pytest.mark.parametrize("version", [min(RESOLVING, key=minor), max(RESOLVING, key=minor)] if RESOLVING else [])
def test_the_store_never_asks_dns_about_the_guard(procs, binary, tmp_path, version):  # noqa: F811
    """torch 2.6+ stores look up the name of every connection's peer, in the thread that serves
    every rank: with a resolver that stalls, 300 connections at once from 127.0.0.1 took the store
    25 s to answer here. torch listens on [::], so a guard dialling 127.0.0.1 reaches it as
    ::ffff:127.0.0.1, which no hosts file names: every connection through the guard asked DNS.
    With upstream-loopback auto the guard dials [::1], which /etc/hosts names: the store asks DNS
    about no connection through the guard (as-written, each one asks; direct, each rank's does)."""
    if "00000000000000000000000000000001" not in open("/proc/self/net/if_inet6").read():
        pytest.skip("no ::1 on this host")
    dns = DNSCounter("127.0.0.153")
    try:
        store, sport = start_store(procs, version, "libuv", wrap=with_hosts_and_resolver(tmp_path, "127.0.0.153"))
        asked = {}
        for label, extra, source in [("auto", (), "127.0.0.1"), ("as-written", ("--upstream-loopback", "as-written"),
                                     "127.0.0.1"), ("direct", None, "127.10.0.7")]:
            # Each guard starts before its count: the store takes its readiness probes' connections
            # (each a lookup, as-written) after they were answered.
            port = sport if extra is None else start_guard(procs, binary, sport, tmp_path, *extra)[1]
            before = len(dns.names)
            for _ in range(20):
                c = Client(version, port, source=source)
                assert c.numkeys() >= 0
                c.sock.close()
            asked[label] = dns.names[before:]
    finally:
        dns.close()
    assert asked["auto"] == [], f"through the guard the store asked DNS: {asked['auto'][:5]}"
    assert len(asked["as-written"]) >= 20, asked["as-written"][:5]
    assert len(asked["direct"]) >= 20, asked["direct"][:5]
    assert store.poll() is None
