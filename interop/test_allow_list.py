"""Issue #41 under real torch: pickles judged by an allow-list, values made of APPENDs judged whole, replies bounded.

* Every module-level callable of the standard library and of torch that `import torch, torch.distributed` loads,
  pickled as a call (interop/pickle_census.py census), is refused through the default policy unless it is on the
  allow-list (`storeguard policy allowed`): every release.
* What torch and the frameworks write (pickle_census.py written: the rendezvous state, tensors of every dtype,
  Size, dtypes, devices, vLLM's PyNcclPipe metadata and ncclUniqueId, containers, datetimes, numpy) passes, at
  every pickle protocol, raw and base64: every release.
* The gadgets that walked around the deny list (pickle_gadgets.py), raw and base64, written through the guard
  into a real store, run nothing in a reader that unpickles what the store holds; written straight to the store,
  each runs (the control): every release, its default backend.
* The os.system pickle sent in pieces by APPEND (one connection, two, a byte at a time, base64, after a SET, its
  first piece written past the guard)
  runs nothing in the reader (2.1.2 legacy, 2.15.0 libuv); the same APPENDs straight to the store run it.
* One MULTI_GET naming an 8 MiB key 131,072 times is refused before it reaches a libuv store (2.4.1, 2.15.0),
  and torch's own multi_get (each key once) passes.
"""
import json
import subprocess

import pytest

from test_interop import ENVS, HERE, Guard, binary, free_port, last_json, procs, run_py, start_store, wait_ready  # noqa: F401
from test_policy import default_backend
from test_auto_generation import Relay

VERSIONS = list(ENVS)
SPLIT_VERSIONS = [v for v in ("2.1.2", "2.15.0") if v in ENVS]  # APPEND: G1 and later; legacy and libuv
MULTI_GET_VERSIONS = [v for v in ("2.4.1", "2.15.0") if v in ENVS]


def judge(binary, text):
    p = subprocess.run([binary, "policy", "judge", "-"], input=text, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return [json.loads(line) for line in p.stdout.splitlines()]


@pytest.fixture(scope="module")
def allowed(binary):  # noqa: F811
    p = subprocess.run([binary, "policy", "allowed"], capture_output=True, text=True, timeout=60, check=True)
    return set(p.stdout.split())


@pytest.mark.parametrize("version", VERSIONS)
def test_every_callable_refused_unless_allowed(binary, allowed, version):  # noqa: F811
    p = run_py(version, HERE / "pickle_census.py", "census", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = judge(binary, p.stdout)
    assert len(recs) > 5000, f"only {len(recs)} callables"
    passed = [r["global"] for r in recs if r["verdict"] == "pass"]
    wrong = [r for r in recs if (r["verdict"] == "pass") != (r["global"] in allowed)]
    assert not wrong, f"{len(wrong)} judged against the allow-list, the first {wrong[:5]}"
    print(f"torch {version}: {len(recs)} callables, {len(recs) - len(passed)} refused, {len(passed)} on the allow-list")


@pytest.mark.parametrize("version", VERSIONS)
def test_what_torch_writes_passes(binary, allowed, version):  # noqa: F811
    p = run_py(version, HERE / "pickle_census.py", "written", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stdout.splitlines() if '"value"' in line]
    recs = judge(binary, "\n".join(lines))
    assert len(recs) > 300
    blocked = [(r["name"], r["protocol"], r.get("detail")) for r in recs if r["verdict"] != "pass"]
    assert not blocked, blocked[:10]
    b64 = [json.dumps({"name": r["name"], "text": __import__("base64").b64encode(bytes.fromhex(json.loads(line)["value"])).decode()})
           for r, line in zip(recs, lines)]
    blocked = [r["name"] for r in judge(binary, "\n".join(b64)) if r["verdict"] != "pass"]
    assert not blocked, blocked[:10]
    missing = {g for line in lines for g in json.loads(line)["globals"]} - allowed
    assert not missing, f"CPython imported globals the allow-list lacks: {sorted(missing)}"


def guarded(procs, binary, tmp, version):  # noqa: F811
    _, sport = start_store(procs, version, default_backend(version))
    relay = Relay(procs, sport, tmp)
    guard = Guard(procs, binary, relay.port, "auto", tmp)
    wait_ready(guard.mport, "the guard")
    return sport, relay, guard


def attack(procs, binary, tmp_path, version, mode, *extra):  # noqa: F811
    sport, relay, guard = guarded(procs, binary, tmp_path, version)
    markers = tmp_path / "markers"
    markers.mkdir()
    p = run_py(version, HERE / "reader_attack.py", guard.port, sport, markers, mode, *extra, timeout=240)
    res = last_json(p.stdout)
    assert res, f"rc={p.returncode} {p.stdout[-1500:]} {p.stderr[-2000:]}"
    return res, relay, guard


@pytest.mark.parametrize("version", VERSIONS)
def test_gadgets_run_nothing_in_a_reader(procs, binary, tmp_path, version):  # noqa: F811
    res, _, guard = attack(procs, binary, tmp_path, version, "gadgets")
    assert res["control_ran"] == res["control"] == 20, f"the control did not run every gadget: {res}"
    assert not res["ran"], f"gadgets ran in the reader: {res['ran']}"
    assert not res["held"], f"the store holds gadgets written through the guard: {res['held']}"
    blocked = [e for e in guard.events() if e.get("event.action") == "blocked"]
    assert len(blocked) == 20 and {e.get("event.reason") for e in blocked} == {"pickle_global_denied"}, \
        [(e.get("storeguard.key"), e.get("event.reason")) for e in blocked]
    assert all(e.get("storeguard.key", "").startswith("/vllm/broadcast/") and "imports " in e.get("storeguard.detail", "")
               and e.get("source.ip") == "127.0.0.1" for e in blocked)


@pytest.mark.parametrize("version", SPLIT_VERSIONS)
def test_append_splits_run_nothing_in_a_reader(procs, binary, tmp_path, version):  # noqa: F811
    res, _, guard = attack(procs, binary, tmp_path, version, "splits")
    assert res["control_ran"] == res["control"] == res["attacks"] == 7, f"the control did not run: {res}"
    assert not res["ran"], f"a split pickle ran in the reader: {res['ran']}"
    rules = {e.get("event.reason") for e in guard.events() if e.get("event.action") == "blocked"}
    assert rules <= {"value_split", "pickle_global_denied"} and rules, rules


@pytest.mark.parametrize("version", MULTI_GET_VERSIONS)
def test_multi_get_of_one_key_many_times_refused(procs, binary, tmp_path, version):  # noqa: F811
    res, relay, guard = attack(procs, binary, tmp_path, version, "multiget")
    assert res["raised"], f"the MULTI_GET was answered: {res}"
    assert res["own_ok"], res
    blocked = [e for e in guard.events() if e.get("event.action") == "blocked"]
    assert [e.get("event.reason") for e in blocked] == ["reply_too_large"], blocked
    # The store never answered it: torch's client WAITs for the keys first (that passes: its reply is one byte),
    # and the one reply of 8 MiB the store sent is the own multi_get's. Answered, it would have sent 1 TiB.
    replies = sum(f.stat().st_size for f in relay.dir.glob("*.s2c"))
    assert replies < 2 * (8 << 20), f"the store sent {replies} bytes: the MULTI_GET reached it"
    print(f"torch {version}: MULTI_GET refused in {res['attack_s']} s; a benign GET loop during it: "
          f"{res['benign_ops']} ops, the slowest {res['benign_max_ms']} ms")
