"""The evidence outlives valid traffic (issue #25): a #106294 probe's blocked event stays in the audit
log after valid connections from many other sources, which rotate only their own file set
(AUDIT-LOG.flows). Real torch stores, a legacy one (the oldest release) and a libuv one (the newest).
"""
import json
import signal
import subprocess

import pytest

from test_interop import NMAP_106294, audit_records, binary, procs, send, start_store  # noqa: F401
from test_resource_safety import STORES, Client, metric, start_guard

# Valid connections, one per source (127.0.3.N: many hosts, as an IPv6 /64 would be one attacker).
CONNECTIONS = 40
# 8 KiB a file and 1 backup for each file set: 40 passed flows (1.2 KiB each) rotate the flows' set 5
# times over; in one set with the security events, as before, 14 of them rotated the probe's event out.
SMALL_AUDIT = "audit:\n  max-bytes: 8192\n  max-backups: 1\n  flows-max-bytes: 8192\n  flows-max-backups: 1\n"


@pytest.mark.parametrize("version,backend", STORES, ids=[f"{v}-{b}" for v, b in STORES])
def test_valid_connections_do_not_rotate_a_probe_out(procs, binary, tmp_path, version, backend):  # noqa: F811
    store, sport = start_store(procs, version, backend)
    cfg = tmp_path / "small-audit.yaml"
    cfg.write_text(SMALL_AUDIT)
    guard, port, mport = start_guard(procs, binary, sport, tmp_path, "--config", str(cfg))
    send(port, NMAP_106294, source="127.0.0.9")
    for i in range(CONNECTIONS):
        # torch 2.15's store now and then takes 5 s to answer a new connection, with or without the guard.
        c = Client(version, port, source=f"127.0.3.{1 + i}", timeout=30)
        c.numkeys()
        c.sock.close()
    flows_rotated = metric(mport, 'storeguard_audit_rotations_total{log="flows"}')
    events_rotated = metric(mport, 'storeguard_audit_rotations_total{log="events"}')
    guard.send_signal(signal.SIGTERM)  # it drains and writes every queued event
    guard.wait(timeout=40)

    log = tmp_path / f"audit-{port}.jsonl"
    evs = []
    for f in [log.with_name(log.name + ".flows.1"), log.with_name(log.name + ".1")]:
        if f.exists():
            evs += audit_records(f)
    evs += audit_records(log)
    blocked = [e for e in evs if e["event.action"] == "blocked" and e.get("source.ip") == "127.0.0.9"]
    assert blocked, f"the probe's blocked event is gone after {CONNECTIONS} valid connections"
    passed = [e for e in evs if e.get("storeguard.verdict") == "passed" and e["source.ip"].startswith("127.0.3.")]
    assert 0 < len(passed) < CONNECTIONS, f"{len(passed)} passed flows kept: the flows' set did not rotate"
    assert flows_rotated and flows_rotated >= 2 and events_rotated == 0, (flows_rotated, events_rotated)

    # storeguard audit reads both sets: the prober is hostile and blocked, the valid sources are jobs.
    p = subprocess.run([binary, "audit", "--format", "json", str(log)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["hostile_sources"] == 1 and s["job_sources"] == len({e["source.ip"] for e in passed}), \
        (s["hostile_sources"], s["job_sources"])
    assert sum(r["events"] for r in s["by_rule"]) == 1, s["by_rule"]
