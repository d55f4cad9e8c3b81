"""Valid traffic that harms the store (issue #25), through `storeguard serve` on its default configuration, against
real stores.

The store quota: one source SETs distinct keys with the largest legal values and never deletes them (torch's own
client, interop/valid_flood.py, behind a relay bound to 127.0.0.2 so that the guard sees a source of its own).
Without the quota the store's host fills at the wire's speed (100 x 8 MiB: +824 MB in 1.2 s). With it the writer is
closed with store_quota_exceeded once its source holds quota.per-source-store-bytes, the store grows by no more,
and a job's own SETs from another source (127.0.0.1), 8 MiB ones included, pass.
"""
import json

import pytest

from test_interop import (ENVS, HERE, Guard, default_backend, free_port, last_json, minor, procs,  # noqa: F401
                          binary, run_py, start_store, wait_ready)

PER_SOURCE_BYTES = 256 << 20  # config/default.yaml quota.per-source-store-bytes
ENTRY_COST = 200  # policy/quota.go entryCost
FLOODS = [(v, n, size) for v, n, size in (("1.13.1", 20, 64 << 20), ("2.15.0", 100, 8 << 20)) if v in ENVS]


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def libuv_args(version):
    return ["--use-libuv", "1" if default_backend(version) == "libuv" else "0"] if minor(version) >= (2, 2) else []


def source_relay(procs, port, source):
    """relay.py in front of the guard, its connections from source: the guard sees clients of the relay as source."""
    rport = free_port()
    p = procs.start(["python3", str(HERE / "relay.py"), str(rport), str(port), "--source", source])
    assert json.loads(p.stdout.readline())["listening"] == rport
    return rport


@pytest.mark.parametrize("version,count,size", FLOODS)
def test_valid_set_flood_stops_at_the_source_quota(procs, binary, tmp_path, version, count, size):
    store, sport = start_store(procs, version, default_backend(version))
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    wait_ready(guard.mport, "the guard")
    rport = source_relay(procs, guard.port, "127.0.0.2")
    before = rss(store.pid)
    p = run_py(version, HERE / "valid_flood.py", "127.0.0.1", rport, "--count", count, "--size", size,
               "--prefix", "flood", *libuv_args(version), timeout=300)
    res = last_json(p.stdout)
    assert p.returncode == 0 and res, f"rc={p.returncode} {p.stdout[-800:]} {p.stderr[-1500:]}"
    grew = rss(store.pid) - before
    key = len("/flood/00")
    fits = PER_SOURCE_BYTES // (size + key + ENTRY_COST)
    assert count - res["failed"] == fits, f"{res}: {fits} SETs fit the source's quota"
    assert grew < PER_SOURCE_BYTES + (64 << 20), f"the store grew by {grew >> 20} MiB"
    blocked = [e for e in guard.events() if e.get("event.action") == "blocked"]
    assert blocked and all(e.get("event.reason") == "store_quota_exceeded" for e in blocked), blocked
    assert all("127.0.0.2 would hold" in e.get("storeguard.detail", "") for e in blocked), blocked
    assert {e.get("source.ip") for e in blocked} == {"127.0.0.2"}, blocked
    assert guard.metrics()["storeguard_store_quota_bytes"] <= PER_SOURCE_BYTES

    # A job's own SETs from another source pass, an 8 MiB one included, and read back intact.
    j = run_py(version, HERE / "valid_flood.py", "127.0.0.1", guard.port, "--count", 2, "--size", 8 << 20,
               "--prefix", "job", "--verify", *libuv_args(version), timeout=120)
    res = last_json(j.stdout)
    assert j.returncode == 0 and res == {"attempted": 2, "failed": 0, "reconnects": 0, "verified": 2}, \
        f"rc={j.returncode} {j.stdout[-800:]} {j.stderr[-1500:]}"
    print(f"{version}: {count} x {size >> 20} MiB from one source: {fits} stored, store RSS +{grew >> 20} MiB")


# --- what real jobs make the store hold (the quota's defaults, docs/policy.md) ------------------------

def jobs(version, guard_port):
    """The workloads measured, each (name, argv, timeout), against a store that outlives them: one that ends
    takes its keys along, and the guard's account with them. Debian 1.13's torchrun does not run on Python 3.11;
    its gloo job stands for the old protocol (the broadcast stores what 2.15's does, within 200 bytes). A torchrun
    job (2,345 bytes, 7 keys when measured) runs through a guard on every release in test_interop, whose
    assert_clean finds any quota refusal."""
    if minor(version) < (2, 0):
        return [("gloo, 4 ranks (init_process_group env://, barrier, all_reduce)",
                 [HERE / "pg_job.py", "127.0.0.1", guard_port, "--rdzv", "agent", "--world-size", 4], 240)]
    return [("gloo, 8 ranks (init_process_group env://, barrier, all_reduce)",
             [HERE / "pg_job.py", "127.0.0.1", guard_port, "--rdzv", "agent", "--world-size", 8,
              *libuv_args(version)], 240),
            ("vLLM-style pickle broadcast (every object x protocol, raw and base64)",
             [HERE / "pickle_broadcast.py", "127.0.0.1", guard_port], 180)]


@pytest.mark.parametrize("version", [v for v in ("1.13.1", "2.15.0") if v in ENVS])
def test_real_jobs_hold_far_below_the_quota(procs, binary, tmp_path, version):
    """Each workload through a guard of its own: it succeeds with 0 violations, and what it made the store hold
    (storeguard_store_quota_bytes, _keys, as the quota counts it) is under 1% of a source's default share."""
    figures = []
    for name, argv, timeout in jobs(version, "GUARD"):
        _, sport = start_store(procs, version, default_backend(version))
        guard = Guard(procs, binary, sport, "auto", tmp_path)
        wait_ready(guard.mport, "the guard")
        argv = [guard.port if a == "GUARD" else a for a in argv]
        p = run_py(version, *argv, timeout=timeout)
        assert p.returncode == 0, f"{name}: rc={p.returncode} {p.stdout[-800:]} {p.stderr[-1500:]}"
        m = guard.metrics()
        held, keys = m["storeguard_store_quota_bytes"], m["storeguard_store_quota_keys"]
        figures.append(f"{version} {name}: {int(held)} bytes, {int(keys)} keys")
        guard.assert_clean()
        assert 0 < held < PER_SOURCE_BYTES / 100, figures[-1]
    print("\n".join(figures))
