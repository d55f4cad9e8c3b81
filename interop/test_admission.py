"""Admission under real torch (issue #25): bans a prober cannot switch off by holding a valid
connection, IPv6 bans per /64, and idle floods from many sources that cannot refuse a new rank.
Each test runs a real store (1.13 legacy, 2.15 libuv) and a real torch job or client beside the
attack, which must see 0 failed ops and no ban.
"""
import json
import math
import os
import random
import socket
import subprocess
import time

import pytest

from test_interop import (ENVS, HERE, Guard, binary, free_port, last_json, minor, procs,  # noqa: F401
                          start_store, wait_ready)
from test_resource_safety import STORES, Client, raise_nofile

NMAP_106294 = bytes.fromhex("0300000b06e00000000000")  # nmap's TerminalServer probe: the #106294 ADD to a G0 store


def config(tmp_path, text):
    path = tmp_path / "admission.yaml"
    path.write_text(text)
    return ("--config", str(path))


def job_args(version, backend, port):
    """pg_job.py: a 2-rank gloo job (barrier, all_reduce) whose ranks are clients of the store behind
    the guard at port (2 ranks, not 4: each is a torch import, 9 s for 2.15 on a loaded 2-core VM)."""
    args = [HERE / "pg_job.py", "127.0.0.1", port, "--rdzv", "store", "--world-size", 2]
    if minor(version) >= (2, 2):
        args += ["--use-libuv", "1" if backend == "libuv" else "0"]
    return args


def start_job(version, backend, port):
    return subprocess.Popen([ENVS[version], *map(str, job_args(version, backend, port))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def job_ok(job):
    out, err = job.communicate(timeout=240)
    res = last_json(out)
    assert job.returncode == 0 and res and res["ok"] and res["reduced"] == 3.0, f"the job failed: {out[-2000:]} {err[-2000:]}"


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_a_prober_holding_a_live_connection_is_throttled(procs, binary, tmp_path, version, backend):  # noqa: F811
    """The prober opens one connection and sends a valid message, then sends the #106294 bytes 300
    times on new connections. It used to be spared as a source serving a job: 300 probes, 0 bans.
    Now its 5th violation bans it; while its valid connection lives it is throttled to
    ban.serving-rate new connections a second, so the probes after the ban are refused at accept
    (ban_throttled) but for about one a second, and that live connection is still served. A gloo
    job from another address runs beside it: 0 failed ops, no ban, no violation."""
    store, sport = start_store(procs, version, backend)
    guard = Guard(procs, binary, sport, "auto", tmp_path, extra=config(tmp_path, "ban:\n  exempt: []\n"))
    wait_ready(guard.mport, "storeguard")
    job = start_job(version, backend, guard.port)
    prober = Client(version, guard.port, source="127.0.0.5")
    prober.numkeys()
    t0 = time.monotonic()
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", guard.port), timeout=5, source_address=("127.0.0.5", 0)) as s:
                s.sendall(NMAP_106294)
                s.settimeout(0.01)  # a judged probe is closed at once; a refused one is read for ban.peek
                s.recv(1)
        except OSError:
            pass
    took = time.monotonic() - t0
    judged = lambda: guard.total("storeguard_violations_total")  # noqa: E731
    throttled = lambda: guard.total('storeguard_connections_refused_total{reason="ban_throttled"}')  # noqa: E731
    for _ in range(100):
        if judged() + throttled() >= 300:
            break
        time.sleep(0.1)
    assert judged() + throttled() == 300, (judged(), throttled())
    assert guard.total("storeguard_bans_total") == 1
    # 5 violations ban; connections admitted by then are judged still, and after the ban at most
    # one a second, from an empty bucket.
    ban = [e for e in guard.events() if e["event.action"] == "banned"][0]["@timestamp"]
    after = [f for f in guard.flows() if f.get("storeguard.verdict") == "blocked" and f["event.start"] > ban]
    assert len(after) <= math.ceil(took) + 1, f"{len(after)} probes admitted in the {took:.1f} s after the ban"
    assert judged() < 100, f"{judged()} of 300 probes judged, want the rest refused"
    prober.numkeys()  # its live connection: still served
    job_ok(job)
    evs = guard.events()
    assert {e["source.ip"] for e in evs} == {"127.0.0.5"}, f"a finding of another source than the prober: {evs}"
    assert guard.total("storeguard_panics_recovered_total") == 0


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_an_idle_flood_from_40_sources_does_not_refuse_a_new_rank(procs, binary, tmp_path, version, backend):  # noqa: F811
    """40 sources x 512 idle connections against caps.max-connections 20,000 (each source in a /24
    of its own), scaled by 10 to fit this machine: 40 sources x 52 against 2,000, per-prefix-connections
    1,000. The flood fills the cap (its own excess takes the place of its own silent connections).
    A new rank from another source used to be refused (max_connections); now each of a gloo job's
    ranks, arriving at the full cap, takes the place of the newest silent connection of a flooding
    source, and the job runs: 0 failed ops, no violation, no ban, no refusal."""
    raise_nofile()  # this test holds 2,080 sockets itself
    store, sport = start_store(procs, version, backend)
    guard = Guard(procs, binary, sport, "auto", tmp_path,
                  extra=config(tmp_path, "caps:\n  max-connections: 2000\n  per-prefix-connections: 1000\n"))
    wait_ready(guard.mport, "storeguard")
    flood = []
    for i in range(40 * 52):
        try:
            flood.append(socket.create_connection(("127.0.0.1", guard.port), timeout=5,
                                                  source_address=(f"127.0.{1 + i % 40}.1", 0)))
        except OSError:
            pass
    # A connection admitted in place of a silent one is counted before its victim is closed: under load the
    # count passes the cap by the evictions in flight (31 once in CI), then settles at it.
    for _ in range(200):
        if guard.total("storeguard_connections_active") == 2000:
            break
        time.sleep(0.1)
    assert guard.total("storeguard_connections_active") == 2000, "the flood did not fill caps.max-connections"
    evicted = guard.total("storeguard_silent_evictions_total")
    job_ok(start_job(version, backend, guard.port))
    ranks = 4 if minor(version) <= (2, 0) else 2  # torch <= 2.0: a silent callback connection each
    assert guard.total("storeguard_silent_evictions_total") >= evicted + ranks
    assert guard.total('storeguard_connections_refused_total{reason="max_connections"}') == 0
    assert guard.total("storeguard_violations_total") == 0 and guard.total("storeguard_bans_total") == 0
    for s in flood:
        s.close()


# --- IPv6: a network namespace of the test's own, 20 addresses of one /64 on its loopback ----------

def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


NET64 = "2001:db8:25:1::"


@pytest.fixture
def v6ns():
    name = f"sg-v6-{os.getpid() % 10000}{random.randrange(100):02d}"
    p = ip("netns", "add", name, check=False)
    if p.returncode != 0:
        pytest.skip(f"'ip netns add' is not permitted here: {p.stderr.strip()[:200]}")
    try:
        ip("-n", name, "link", "set", "lo", "up")
        for a in [f"{NET64}{i:x}" for i in range(1, 22)] + ["2001:db8:25:2::1"]:
            ip("-n", name, "addr", "add", f"{a}/128", "dev", "lo", "nodad")
        yield name
    finally:
        ip("netns", "del", name, check=False)


def test_twenty_addresses_of_one_ipv6_64_make_one_ban(procs, binary, tmp_path, v6ns):  # noqa: F811
    """A prober with an IPv6 /64 sends the #106294 bytes once from each of 20 of its addresses,
    twice over, to a guard in front of a real 1.13 store (all in a namespace of the test's own).
    It used to earn 20 separate bans, 5 probes from each address; now the /64 is banned once, at
    its 5th violation, and every later connection from it, from any address, is refused. Another
    /64 is still judged, and a real torch client is served."""
    version = min(ENVS, key=minor)
    sport, port = free_port(), free_port()
    inns = ["ip", "netns", "exec", v6ns]
    store = procs.start([*inns, ENVS[version], str(HERE / "workload.py"), "127.0.0.1", str(sport), "--role", "master"])
    assert json.loads(store.stdout.readline()).get("ready")
    audit = tmp_path / "audit.jsonl"
    guard = subprocess.Popen([*inns, binary, "serve", "--listen", f"[::]:{port}", "--upstream", f"127.0.0.1:{sport}",
                              "--metrics-listen", "", "--audit-log", str(audit), "--config",
                              config(tmp_path, "ban:\n  exempt: []\n")[1]],
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "guard.log", "w"), start_new_session=True)
    procs.procs.append(guard)
    probe = f"""
import json, socket, sys, time
port = {port}
sources = ["{NET64}%x" % i for i in range(1, 21)] * 2 + ["2001:db8:25:2::1"]
for _ in range(100):  # the guard is up
    try:
        socket.create_connection(("::1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
for src in sources:
    try:
        with socket.create_connection(("{NET64}1", port), timeout=5, source_address=(src, 0)) as s:
            s.sendall(bytes.fromhex("{NMAP_106294.hex()}"))
            s.settimeout(5)
            s.recv(1)  # the guard's close: judged, or refused (and read for ban.peek)
    except OSError:
        pass
print(json.dumps({{"sent": len(sources)}}))
"""
    p = subprocess.run([*inns, "/usr/bin/python3", "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    client = subprocess.run([*inns, ENVS[version], str(HERE / "workload.py"), "127.0.0.1", str(port), "--role", "client",
                             "--prefix", "v6"], capture_output=True, text=True, timeout=120)
    assert client.returncode == 0 and last_json(client.stdout)["ok"], client.stdout[-2000:] + client.stderr[-2000:]

    def events():
        return [json.loads(line) for line in audit.read_text().splitlines() if line.strip()] if audit.exists() else []
    for _ in range(100):  # the last refused connection's record
        if len([e for e in events() if e.get("event.action") == "flow" and e.get("source.ip", "").startswith("2001")]) >= 41:
            break
        time.sleep(0.1)
    evs = events()
    banned = [e for e in evs if e.get("event.action") == "banned"]
    assert len(banned) == 1 and banned[0]["source.ip"].startswith(NET64), f"bans {banned}, want one, in {NET64}/64"
    blocked = [e["source.ip"] for e in evs if e.get("event.action") == "blocked"]
    assert blocked[:5] == [f"{NET64}{i:x}" for i in range(1, 6)] and blocked[5:] == ["2001:db8:25:2::1"], blocked
    refused = [e for e in evs if e.get("event.action") == "denied" and e.get("event.reason") == "banned"]
    assert len(refused) == 35 and all(e["source.ip"].startswith(NET64) for e in refused), len(refused)
