"""Well-formed attacks (issue #24) under real torch, through `storeguard serve` on its default configuration.

Every byte of these attacks is valid TCPStore, sent by torch's own client (interop/policy_attack.py):
  * T1: a pickle whose __reduce__ is os.system written into torchrun's rendezvous state
    (`torch.rendezvous.<run_id>`) by SET, COMPARE_SET (expected = the current state) and MULTI_SET, while a
    torchrun c10d job runs through the guard: whoever unpickles the state (every agent, at its next sync)
    would run the command, which touches a marker file;
  * T3/T7: overwrites and a delete of keys torch writes once per round (MASTER_ADDR, assigned_ranks).
Topology: a real TCPStore of the same release (hosted by the attacker's process, policy_attack.py --serve-store, or
workload.py --role master) <- recording relay (relay.py) <- guard (default configuration) <- torchrun agents
(--rdzv-conf is_host=false) and the attacker. The relay's bytes say what reached the store. Only the agents'
rendezvous connections go through the guard; the workers' own store is the agent's (interop/README.md).
The false-positive side: ordinary pickles broadcast through the store (vLLM style), a torchrun job whose
worker fails once (--max-restarts 2), and a 2-node elastic job (--nnodes 1:2), all with 0 violations.

interop/results/policy-facts.md has the keys and ops a clean torchrun job writes (interop/policy_facts.py).
One torchrun job per release serves the pickle attacks and, on 2.4.1 and 2.15.0, the single-writer
overwrites (test_single_writer_keys_overwrite_blocked reads the same job's outcome).
"""
import base64
import concurrent.futures
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import store_trace
from test_auto_generation import Relay, generation
from test_interop import (ENVS, HERE, Guard, Procs, binary, default_backend, free_port, last_json, minor,  # noqa: F401
                          procs, run_py, start_store, wait_ready)

# The attack through a real torchrun agent: the first release with its c10d rendezvous on Python 3.11 (Debian
# 1.13's torchrun does not run there), one between, the newest. The rule does not depend on the release (the key
# and the pickle are the same in every one, interop/results/policy-facts.md); test_interop runs torchrun's
# rendezvous through the guard on every release, and the CI's 50 minutes do not hold all seven here.
TORCHRUN_VERSIONS = [v for v in ("2.0.1", "2.6.0", "2.15.0") if v in ENVS]
WRITE_ONCE_VERSIONS = [v for v in ("2.4.1", "2.15.0") if v in ENVS]
PICKLE_RULES = ("rendezvous_state_invalid", "pickle_global_denied")
STATE_KEY_PREFIX = "torch.rendezvous."  # c10d_rendezvous_backend: "torch.rendezvous." + run_id (the client adds "/")
ATTACK_SECONDS = 6  # the workload's all_reduce loop while the attacks land (agents sync every 5 s)
MONITOR_MARKER_SECONDS = 15


# --- a torchrun job --------------------------------------------------------------------------------

class Job:
    """One torchrun agent (c10d rendezvous at 127.0.0.1:port, is_host=false) running policy_worker.py.
    Several agents of one job (--nnodes 1:2) share run_id and out."""

    def __init__(self, procs, version, port, tmp, run_id, out, name="agent", nnodes="1", nproc=2, seconds=2.0,
                 max_restarts=0, fail_once=None, rdzv_conf=""):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logpath = Path(tmp) / f"{name}.log"
        self.log = open(self.logpath, "w")
        conf = "is_host=false" + ("," + rdzv_conf if rdzv_conf else "")
        cmd = [ENVS[version], "-W", "ignore", "-m", "torch.distributed.run", "--nnodes", nnodes,
               "--nproc_per_node", str(nproc), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
               "--rdzv_id", run_id, "--rdzv_conf", conf, "--max_restarts", str(max_restarts),
               "--monitor_interval", "1", str(HERE / "policy_worker.py")]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PW_OUT": str(self.out), "PW_SECONDS": str(seconds)}
        if fail_once is not None:
            env["PW_FAIL_ONCE"] = str(fail_once)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        procs.procs.append(self.proc)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n=25):
        self.log.flush()
        return "\n".join(self.logpath.read_text(errors="replace").splitlines()[-n:])


def started(out, ranks):
    """Whether every rank's process group is up (policy_worker.py's started<R>-<attempt> files)."""
    return all(list(Path(out).glob(f"started{r}-*")) for r in range(ranks))


def rank_results(out, world_size):
    got = {}
    for r in range(world_size):
        try:
            got[r] = json.loads((Path(out) / f"rank{r}.json").read_text())
        except (OSError, ValueError):
            got[r] = None
    return got


def result_problems(out, world_size):
    """What is wrong with the ranks' results: missing, another world size, a wrong checksum."""
    bad = []
    for r, res in rank_results(out, world_size).items():
        if res is None:
            bad.append(f"rank {r}: no result")
        elif res["world_size"] != world_size or res["checksum"] != res["expected"]:
            bad.append(f"rank {r}: world {res['world_size']} checksum {res['checksum']} expected {res['expected']}")
    return bad


class RelayOn(Relay):
    """test_auto_generation's Relay (interop/relay.py, recording) on a port chosen beforehand, so that the guard can
    start before it: relay.py dials the store for each connection it accepts, so it must start after the store."""

    def __init__(self, procs, store_port, tmp, port):  # noqa: super().__init__ would choose the port itself
        self.port = port
        self.dir = Path(tmp) / f"relay-{self.port}"
        p = procs.start(["python3", str(HERE / "relay.py"), str(self.port), str(store_port), "--record", str(self.dir)])
        assert json.loads(p.stdout.readline())["listening"] == self.port


def guarded_store(procs, binary, tmp, version, extra=()):
    """The store (the release's default backend), a recording relay, the guard (default configuration)."""
    _, sport = start_store(procs, version, default_backend(version))
    relay = Relay(procs, sport, tmp)
    guard = Guard(procs, binary, relay.port, "auto", tmp, extra=extra)
    wait_ready(guard.mport, "the guard")
    return relay, guard


def relay_bytes(relay):
    return [f.read_bytes() for f in relay.conns()]


def relay_writes(relay, version):
    return store_trace.writes(relay.dir, generation(version, default_backend(version)))


def wire_key_of(relay, version, suffix, ops=("SET", "MULTI_SET")):
    """The first key a job wrote (by one of ops) ending in suffix, as the client API takes it (no leading '/')."""
    for _, op, key, _ in relay_writes(relay, version):
        k = key.decode("latin-1")
        if op in ops and k.endswith(suffix):
            return k[1:] if k.startswith("/") else k
    return None


# --- the attacked job (one per release and mode, shared by the tests that read it) ---------------------

# The attacked jobs of the tests selected in this session, run PARALLEL at a time from the first test that
# needs one: most of a job's time is torch imports and the workload's sleeps, which overlap well on 2 cores.
PARALLEL = int(os.environ.get("STOREGUARD_POLICY_PARALLEL", "2"))
_JOBS = {}  # (version, mode, write_once) -> Future


def _jobs_wanted(items):
    """The attacked jobs the selected tests read, in test order; one per release serves A and E."""
    wanted = []
    for item in items:
        version = getattr(item, "callspec", None) and item.callspec.params.get("version")
        name = getattr(item, "originalname", "")
        if name == "test_torchrun_pickle_attack_blocked":
            wanted.append((version, "enforce", version in WRITE_ONCE_VERSIONS))
        elif name == "test_single_writer_keys_overwrite_blocked":
            wanted.append((version, "enforce", True))
        elif name == "test_torchrun_pickle_attack_monitor_mode":
            wanted.append((version, "monitor", False))
    return list(dict.fromkeys(wanted))


@pytest.fixture(scope="module")
def outcomes(request, binary, tmp_path_factory):  # noqa: F811
    """outcomes(version, mode, write_once): the attacked job's outcome, from a pool that runs the jobs of
    every selected test, PARALLEL at a time."""
    pool = concurrent.futures.ThreadPoolExecutor(max(1, PARALLEL))

    def submit(job):
        if job not in _JOBS:
            _JOBS[job] = pool.submit(attacked_job, binary, tmp_path_factory.mktemp(f"attacked-{job[0]}-{job[1]}"), *job)
        return _JOBS[job]

    for job in _jobs_wanted(request.session.items):
        submit(job)
    yield lambda version, mode="enforce", write_once=False: submit((version, mode, write_once)).result()
    for f in _JOBS.values():
        f.cancel()
    pool.shutdown(wait=True)
    _JOBS.clear()


def pickle_specs(version, key, markers):
    specs = [{"op": "set", "key": key, "value": {"pickle_system": f"touch {markers['set']}"}, "tag": "pickle"},
             {"op": "compare_set", "key": key, "value": {"pickle_system": f"touch {markers['compare_set']}"},
              "tag": "pickle"}]
    if minor(version) >= (2, 1):  # 2.0's Python Store has no multi_set (policy_attack.py reports it absent anyway)
        specs.append({"op": "multi_set", "key": key, "value": {"pickle_system": f"touch {markers['multi_set']}"},
                      "tag": "pickle"})
    return specs


def attacked_job(binary, tmp, version, mode="enforce", write_once=False):
    """Runs a torchrun job through the guard, the attacks while it runs, and returns what happened
    (a dict; the test asserts). Self-contained (its own processes, ports and directory), so that jobs can
    run side by side (outcomes, below)."""
    tmp = Path(tmp)
    ps = Procs()
    o = {"version": version, "mode": mode}
    t = [("begin", time.monotonic())]
    try:
        # The attacker's process also hosts the store under attack (one torch start less per job). The guard
        # starts first (as a sidecar does: it asks the store again until it answers) and the job's agent imports
        # torch meanwhile; the relay starts once the store listens (relay.py dials the store per connection).
        sport, rport = free_port(), free_port()
        attacker_log = tmp / "attacker.log"
        attacker = subprocess.Popen([ENVS[version], "-W", "ignore", str(HERE / "policy_attack.py"), "127.0.0.1", "0", "-",
                                     "--go", "--serve-store", str(sport)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=open(attacker_log, "w"), text=True, start_new_session=True)
        ps.procs.append(attacker)
        guard = Guard(ps, binary, rport, "auto", tmp, extra=("--mode", mode) if mode != "enforce" else ())
        run_id = "pol" + uuid.uuid4().hex[:8]
        key = STATE_KEY_PREFIX + run_id
        markers = {a: tmp / f"pwned-{a}-{uuid.uuid4().hex[:6]}" for a in ("set", "compare_set", "multi_set")}
        out = tmp / "job-out"
        job = Job(ps, version, guard.port, tmp, run_id, out, seconds=ATTACK_SECONDS)
        line = attacker.stdout.readline()
        assert line and json.loads(line).get("ready"), f"attacker/store: {line!r} {attacker_log.read_text()[-2000:]}"
        relay = RelayOn(ps, sport, tmp, rport)
        wait_ready(guard.mport, "the guard")
        t.append(("store and guard ready", time.monotonic()))
        deadline = time.monotonic() + 120
        while not started(out, 2) and job.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started(out, 2), f"the job never started its workers (rc {job.proc.poll()}):\n{job.tail()}"
        specs = pickle_specs(version, key, markers)
        if write_once:
            addr = wire_key_of(relay, version, "/MASTER_ADDR")
            ranks = wire_key_of(relay, version, "torchelastic/assigned_ranks/0")
            assert addr and ranks, f"the job wrote no MASTER_ADDR ({addr}) or assigned_ranks/0 ({ranks}) through the guard"
            o["write_once_keys"] = {"MASTER_ADDR": addr, "assigned_ranks/0": ranks}
            specs += [{"op": "set", "key": addr, "value": "10.66.66.66", "tag": "write_once"},
                      {"op": "set", "key": ranks, "value": "[66, 66]", "tag": "write_once"},
                      {"op": "delete_key", "key": addr, "tag": "write_once"}]
        t0 = time.monotonic()
        t.append(("workers up", t0))
        attacker.stdin.write(json.dumps({"port": guard.port, "spec": specs}) + "\n")
        attacker.stdin.flush()
        o["attacks"] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the attacker's results, until it is done (it keeps the store)
            line = attacker.stdout.readline()
            if not line or json.loads(line).get("done"):
                break
            o["attacks"].append(json.loads(line))
        o["attacker_stderr"] = attacker_log.read_text(errors="replace")[-2000:]
        t.append(("attacks done", time.monotonic()))
        if mode == "monitor":  # the agents unpickle the state at their next sync (keep-alive every 5 s)
            while not markers["set"].exists() and time.monotonic() - t0 < MONITOR_MARKER_SECONDS:
                time.sleep(0.2)
        o["rc"] = job.wait(120)
        t.append(("job done", time.monotonic()))
        o["tail"] = job.tail()
        o["results"] = result_problems(out, 2)
        o["markers"] = {a: m.exists() for a, m in markers.items()}
        o["marker_paths"] = {a: str(m) for a, m in markers.items()}
        time.sleep(0.5)  # the last flow records
        o["events"] = guard.events()
        o["flows"] = guard.flows()
        o["metrics"] = guard.metrics()
        o["relay"] = relay_bytes(relay)
        o["writes"] = relay_writes(relay, version)
        o["key"] = key
    finally:
        ps.stop_all()
    t.append(("stopped", time.monotonic()))
    o["timing"] = ", ".join(f"{name} +{at - t[0][1]:.1f}s" for name, at in t[1:])
    return o


def pickle_attacks(o, ops=("set", "compare_set", "multi_set")):
    """The T1 attacks that ran (multi_set is absent from 2.0's Python API)."""
    return [a for a in o["attacks"] if a.get("tag") == "pickle" and a["op"] in ops and a.get("stage") != "absent"]


def pickle_problems(o, ops=("set", "compare_set", "multi_set"), blocked_action="blocked"):
    """What the guard let happen to the T1 attacks: code ran, a call went through, bytes reached the store, events missing."""
    probs = []
    for a in pickle_attacks(o, ops):
        op = a["op"]
        if o["markers"][op]:
            probs.append(f"{op}: the pickle ran in an agent (marker {o['marker_paths'][op]} exists)")
        if not a["raised"]:
            probs.append(f"{op}: the attacker's call went through (the guard did not close its connection)")
        elif a.get("client_bug") or a["stage"] not in ("call", "check"):
            probs.append(f"{op}: the attacker failed otherwise ({a['stage']}: {a['error']})")
        payload = a["payload"].encode("latin-1")
        raw = base64.b64decode(payload)
        marker = o["marker_paths"][op].encode()
        reached = [i for i, b in enumerate(o["relay"]) if payload in b or raw in b or marker in b]
        if reached:
            probs.append(f"{op}: the attack's bytes reached the store (relay connections {reached})")
    n = len(pickle_attacks(o, ops))
    evs = [e for e in o["events"] if e.get("event.action") == blocked_action and e.get("event.reason") in PICKLE_RULES]
    if len(evs) < n:
        probs.append(f"{len(evs)} {blocked_action} events of {PICKLE_RULES} for {n} attacks; events: "
                     f"{[(e.get('event.action'), e.get('event.reason')) for e in o['events']]}")
    for e in evs:
        if "storeguard.detail" in e and not any(g in str(e["storeguard.detail"]) for g in ("os.system", "posix.system")):
            probs.append(f"the event names no os.system / posix.system: {e['storeguard.detail']!r}")
    return probs, evs


# --- T1: a pickle in the rendezvous state ----------------------------------------------------------

@pytest.mark.parametrize("version", TORCHRUN_VERSIONS)
def test_torchrun_pickle_attack_blocked(outcomes, version):
    """SET, COMPARE_SET (expected = the current state) and MULTI_SET (2.1+) of base64(pickle of os.system) on the
    rendezvous state key, each on a connection of its own, while a 2-worker torchrun job runs through the guard
    (default configuration): no code runs, each attacker call fails (closed), one blocked event per attack
    (rendezvous_state_invalid or pickle_global_denied), 0 bytes of any attack reach the store, the job
    finishes with the right checksum."""
    o = outcomes(version, write_once=version in WRITE_ONCE_VERSIONS)
    attacks = {a["op"] for a in pickle_attacks(o)}
    assert {"set", "compare_set"} <= attacks, f"attacks that ran: {o['attacks']} {o['attacker_stderr']}"
    if minor(version) >= (2, 1):
        assert "multi_set" in attacks, o["attacks"]
    probs, _ = pickle_problems(o)
    if o["rc"] != 0 or o["results"]:
        probs.append(f"the job failed: rc {o['rc']} {o['results']}: {o['tail'].splitlines()[-1:]}")
    print(f"{version}: {o['timing']}")
    assert not probs, "well-formed pickle attacks were not stopped:\n  " + "\n  ".join(probs)
    assert o["metrics"].get("storeguard_panics_recovered_total", 0) == 0


@pytest.mark.parametrize("version", [v for v in ("2.15.0",) if v in ENVS])
def test_torchrun_pickle_attack_monitor_mode(outcomes, version):
    """--mode monitor: the pickle SET is let through (the agents unpickle it: the marker appears, or the job
    dies; its success is not required) and recorded as would_block with the rule."""
    o = outcomes(version, mode="monitor")
    set_attack = pickle_attacks(o, ("set",))
    assert set_attack and not set_attack[0]["raised"], f"monitor mode closed the attacker, or it failed: {set_attack}"
    payload = set_attack[0]["payload"].encode()
    assert any(payload in b for b in o["relay"]), "monitor mode did not forward the SET to the store"
    assert o["markers"]["set"] or o["rc"] != 0, f"the forwarded pickle reached no agent in {MONITOR_MARKER_SECONDS} s"
    would = [e for e in o["events"] if e.get("event.action") == "would_block" and e.get("event.reason") in PICKLE_RULES]
    assert would, f"no would_block event of {PICKLE_RULES}: " + \
        str([(e.get("event.action"), e.get("event.reason")) for e in o["events"]])
    assert not [e for e in o["events"] if e.get("event.action") == "blocked"], "monitor mode blocked"


# --- no false positive: ordinary pickles through the store ----------------------------------------

BROADCAST_VERSIONS = [v for v in ("1.13.1", "2.4.1", "2.15.0") if v in ENVS]


@pytest.mark.parametrize("version", BROADCAST_VERSIONS)
def test_pickle_broadcast_of_ordinary_objects_passes(procs, binary, tmp_path, version):
    """vLLM-style: one client SETs pickle.dumps(obj) of dicts, lists, a datetime, a tensor, torch.Size and dtypes
    (vLLM's PyNcclPipe metadata), collections and a nested structure, at every protocol, raw and base64; another
    GETs and compares each. All pass through the default guard, 0 violations, every flow passed/empty/open."""
    sport = free_port()  # the store is pickle_broadcast.py's own (one torch start less); the guard holds it until it is up
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    p = run_py(version, HERE / "pickle_broadcast.py", "127.0.0.1", guard.port, "--prefix", "bc", "--serve-store", sport,
               timeout=180)
    res = last_json(p.stdout)
    blocked = [(e.get("storeguard.key"), e.get("event.reason"), e.get("storeguard.detail")) for e in guard.events()]
    assert p.returncode == 0 and res and res["ok"], f"rc={p.returncode} {p.stdout.strip()[-1500:]}; guard: {blocked}"
    assert res["checked"] == 8 * len(res["protocols"]) * 2 and len(res["protocols"]) >= 5, res  # objects x protocols x forms
    guard.assert_clean()


FRAMEWORK_POLICY = """rules:
  - name: framework-raw
    keys: ["fw/*/raw"]
    action: value
    value: {kind: pickle, globals: ["pickle_broadcast.*"]}
  - name: framework-b64
    keys: ["fw/*/b64"]
    action: value
    value: {kind: base64-pickle, globals: ["pickle_broadcast.*"]}
"""


@pytest.mark.parametrize("version", BROADCAST_VERSIONS)
def test_pickle_broadcast_of_a_frameworks_classes(procs, binary, tmp_path, version):
    """A framework's own classes (a dataclass, a namedtuple, them nested) are not on the default allow-list: each
    such SET is refused on its own connection, naming the class. With a policy file that allows the framework's
    module on its keys (value.globals), the same broadcast passes and reads back equal, 0 violations."""
    sport = free_port()
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    p = run_py(version, HERE / "pickle_broadcast.py", "127.0.0.1", guard.port, "--prefix", "fw", "--serve-store", sport,
               "--objects", "framework", "--each", timeout=180)
    res = last_json(p.stdout)
    assert res and res["passed"] == 0 and len(res["closed"]) >= 3 * 5 * 2, f"rc={p.returncode} {p.stdout[-1500:]}"
    refused = sum(v for k, v in guard.metrics().items()
                  if k.startswith("storeguard_violations_total") and "pickle_global_denied" in k)
    assert refused == len(res["closed"]), f"{refused} refused, {len(res['closed'])} closed"
    blocked = [e for e in guard.events() if e.get("event.action") == "blocked"]  # sampled past the first ones
    assert blocked and all(e.get("event.reason") == "pickle_global_denied" and
                                                 "pickle_broadcast." in e.get("storeguard.detail", "") for e in blocked), blocked[:3]

    policy, config = tmp_path / "framework.yaml", tmp_path / "storeguard.yaml"
    policy.write_text(FRAMEWORK_POLICY)
    config.write_text(f"policy:\n  file: {policy}\n")
    sport2 = free_port()
    guard2 = Guard(procs, binary, sport2, "auto", tmp_path, extra=("--config", str(config)))
    p = run_py(version, HERE / "pickle_broadcast.py", "127.0.0.1", guard2.port, "--prefix", "fw", "--serve-store", sport2,
               "--objects", "framework", timeout=180)
    res = last_json(p.stdout)
    assert p.returncode == 0 and res and res["ok"], f"rc={p.returncode} {p.stdout.strip()[-1500:]}; guard: {guard2.events()}"
    guard2.assert_clean()
    # What passed is in the flow records and the report: the pickles stored, on which keys, by whom.
    stored = sum(int(e.get("storeguard.pickles", 0)) + int(e.get("storeguard.base64_pickles", 0)) for e in guard2.flows())
    assert stored >= 3 * 5 * 2, f"{stored} pickles in the flow records"
    rep = subprocess.run([binary, "audit", "--format", "json", str(guard2.audit)], capture_output=True, text=True, timeout=60)
    summary = json.loads(rep.stdout)
    texts = [f["text"] for f in summary["reached_store"]["findings"]]
    assert any("stored" in t and "/fw/" in t and "127.0.0.1" in t for t in texts), texts


VLLM_VERSION = "2.15.0"  # vLLM 0.33.0 pins torch 2.14; its StatelessProcessGroup and PyNccl id class need only torch


@pytest.fixture(scope="module")
def vllm_path():
    """vLLM's Python source and the few packages its vllm.distributed.utils imports (scripts/vllm-src.sh)."""
    p = subprocess.run([str(HERE.parent / "scripts" / "vllm-src.sh")], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    root = p.stdout.strip().splitlines()[-1]
    return f"{root}/src:{root}/deps"


@pytest.mark.skipif(VLLM_VERSION not in ENVS, reason="no torch for vLLM")
def test_vllm_stateless_process_group_passes(procs, binary, tmp_path, vllm_path):
    """vLLM's own StatelessProcessGroup (a real release's vllm/distributed/utils.py) over three ranks through the
    default guard: broadcast_obj, send_obj/recv_obj of PyNcclPipe metadata, all_gather_obj, tensor broadcast,
    send/recv and all_reduce (tensors pickled), barrier, and PyNcclCommunicator's broadcast of its ncclUniqueId.
    Every rank gets what was sent; 0 violations."""
    sport = free_port()
    guard = Guard(procs, binary, sport, "auto", tmp_path)
    p = run_py(VLLM_VERSION, HERE / "vllm_spg.py", "127.0.0.1", guard.port, "--serve-store", sport, timeout=180,
               env={"PYTHONPATH": vllm_path})
    res = last_json(p.stdout)
    assert p.returncode == 0 and res and res["ok"], f"rc={p.returncode} {p.stdout[-1500:]} {p.stderr[-1500:]}; {guard.events()}"
    guard.assert_clean()
    stored = sum(int(e.get("storeguard.pickles", 0)) for e in guard.flows())
    assert stored > 0, "no pickle in the flow records"


# --- T9: a pickle that runs code, on any key (vLLM-style broadcast keys) ---------------------------

@pytest.mark.parametrize("version", [v for v in ("1.13.1", "2.4.1", "2.15.0") if v in ENVS])
def test_pickle_on_any_key_blocked(procs, binary, tmp_path, version):
    """torch's own client SETs a pickle of os.system, raw and as base64, on keys a framework broadcasts objects
    through, each on a connection of its own, against a real store through the default guard: each is closed
    with pickle_global_denied naming the global, and none of their bytes reach the store (recording relay)."""
    relay, guard = guarded_store(procs, binary, tmp_path, version)
    specs = [{"op": "set", "key": "vllm/broadcast/0", "value": {"raw_pickle_system": "true"}, "tag": "raw"},
             {"op": "set", "key": "bc/obj", "value": {"pickle_system": "true"}, "tag": "base64"}]
    p = run_py(version, HERE / "policy_attack.py", "127.0.0.1", guard.port, json.dumps(specs), timeout=120)
    attacks = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(attacks) == 2, f"rc={p.returncode} {p.stdout[-1500:]} {p.stderr[-1500:]}"
    for a in attacks:
        assert a["raised"] and not a.get("client_bug") and a["stage"] in ("call", "check"), a
        payload = a["payload"].encode("latin-1")
        assert not any(payload in b for b in relay_bytes(relay)), f"{a['tag']}: the pickle reached the store"
    evs = [e for e in guard.events() if e.get("event.action") == "blocked"]
    assert sorted((e.get("storeguard.key"), e.get("event.reason")) for e in evs) == [
        ("/bc/obj", "pickle_global_denied"), ("/vllm/broadcast/0", "pickle_global_denied")], evs
    assert all("posix.system" in e.get("storeguard.detail", "") for e in evs), evs


# --- no false positive: elastic restarts and two nodes ---------------------------------------------

@pytest.mark.parametrize("version", WRITE_ONCE_VERSIONS)
def test_elastic_restarts_and_two_nodes_no_policy_violation(procs, binary, tmp_path, version):
    """Two jobs side by side through one default guard: torchrun --max-restarts 2 whose global rank 1 exits 1 on
    its first attempt (the agent re-rendezvouses: round 1), and a 2-node --nnodes 1:2 job (two agents, one
    worker each): both succeed with the right checksums, and the guard records 0 violations of any kind."""
    relay, guard = guarded_store(procs, binary, tmp_path, version)
    out, out2 = tmp_path / "restart-out", tmp_path / "nodes-out"
    rs_id, tn_id = "rs" + uuid.uuid4().hex[:8], "tn" + uuid.uuid4().hex[:8]
    job = Job(procs, version, guard.port, tmp_path, rs_id, out, name="restarts", max_restarts=2, fail_once=1,
              seconds=1)
    nodes = [Job(procs, version, guard.port, tmp_path, tn_id, out2, name=f"node{i}", nnodes="1:2", nproc=1,
                 seconds=1) for i in range(2)]
    rc, rcs = job.wait(180), [n.wait(180) for n in nodes]
    assert rc == 0 and not result_problems(out, 2), f"restart job: rc {rc} {result_problems(out, 2)}\n{job.tail()}"
    assert {r["restart_count"] for r in rank_results(out, 2).values()} == {1}, rank_results(out, 2)
    assert rcs == [0, 0] and not result_problems(out2, 2), \
        f"2-node job: rcs {rcs} {result_problems(out2, 2)}\n" + "\n".join(n.tail() for n in nodes)
    time.sleep(0.5)
    guard.assert_clean()
    written = {k.decode("latin-1") for _, _, k, _ in relay_writes(relay, version)}  # 2.4+: role_info/<group rank>
    assert f"/torch.rendezvous.{rs_id}.1/torchelastic/role_info/0" in written, \
        f"the restart did not rendezvous again through the guard: {sorted(written)}"
    assert f"/torch.rendezvous.{tn_id}.0/torchelastic/role_info/1" in written, \
        f"the 2-node job did not rendezvous as one round of two through the guard: {sorted(written)}"


# --- T3/T7: single-writer keys (last: the lead decides on the rule) ----------------------------------

@pytest.mark.parametrize("version", WRITE_ONCE_VERSIONS)
def test_single_writer_keys_overwrite_blocked(outcomes, version):
    """While the job of test_torchrun_pickle_attack_blocked runs (its rendezvous round set up, its workers up):
    SET of MASTER_ADDR and of torchelastic/assigned_ranks/0 under the round's prefix (the wire keys the job
    wrote, read from the relay), and DELETE_KEY of MASTER_ADDR: each blocked as key_write_once, none of it
    reaches the store, and the job finishes."""
    o = outcomes(version, write_once=True)
    keys = o["write_once_keys"]
    mine = [a for a in o["attacks"] if a.get("tag") == "write_once"]
    assert len(mine) == 3, o["attacks"]
    probs = []
    for a in mine:
        if not a["raised"]:
            probs.append(f"{a['op']} {a['key']}: went through (the guard did not close the attacker)")
        elif a.get("client_bug") or a["stage"] not in ("call", "check"):
            probs.append(f"{a['op']} {a['key']}: the attacker failed otherwise ({a['stage']}: {a['error']})")
    for conn, op, key, value in o["writes"]:
        k = key.decode("latin-1").lstrip("/")
        if k in keys.values() and (op == "DELETE_KEY" or value in (b"10.66.66.66", b"[66, 66]")):
            probs.append(f"{op} {k} reached the store (relay connection {conn})")
    evs = [e for e in o["events"] if e.get("event.action") == "blocked" and e.get("event.reason") == "key_write_once"]
    if len(evs) < 3:
        probs.append(f"{len(evs)} blocked key_write_once events for 3 attacks; events: "
                     f"{[(e.get('event.action'), e.get('event.reason')) for e in o['events']]}")
    if o["rc"] != 0 or o["results"]:
        probs.append(f"the job failed: rc {o['rc']} {o['results']}: {o['tail'].splitlines()[-1:]}")
    assert not probs, "overwrites of single-writer keys were not stopped:\n  " + "\n  ".join(probs)


# Every release whose torchrun runs here (issue #43: "on every release with torchrun").
PREWRITE_VERSIONS = sorted((v for v in ENVS if minor(v) >= (2, 0)),  # 1.13 (Debian): its torchrun does not run on Python 3.11
                           key=minor)


def prewrite(port, version, key, value, source="127.0.0.66"):
    """An intruder's raw SET of key through the guard at port, from its own loopback address; returns whether the
    guard closed the connection (it refused the write) before a second's wait ran out."""
    import socket
    op = 0 if minor(version) < (2, 2) else 1
    k, v = key.encode(), value.encode()
    hs = b"" if minor(version) < (2, 2) else bytes.fromhex("00cef7853c") + (
        bytes.fromhex("0d01000000") if minor(version) >= (2, 5) else b"")
    msg = hs + bytes([op]) + len(k).to_bytes(8, "little") + k + len(v).to_bytes(8, "little") + v
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(msg)
        s.settimeout(1)
        try:
            while s.recv(4096):
                pass
            return True
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True


@pytest.mark.parametrize("version", PREWRITE_VERSIONS)
def test_an_intruders_early_write_does_not_stop_the_job(procs, binary, tmp_path, version):
    """Before torchrun starts, an intruder SETs round 0's and round 1's MASTER_ADDR and MASTER_PORT (both spellings:
    with the client's "/" and without). The write-once rule used to take those for the first writes and refuse the
    agent's own: torchrun exited 1 with no rank run (without the guard the agent overwrites them). Now the
    intruder's writes are refused (the run's rendezvous had not begun) and named in the audit; the job runs, a
    rank fails once and the agent re-rendezvouses (round 1), rc 0, with 0 violations of the job's own."""
    relay, guard = guarded_store(procs, binary, tmp_path, version)
    run_id = "pre" + uuid.uuid4().hex[:8]
    keys = [f"{lead}torch.rendezvous.{run_id}.{r}/{name}" for r in (0, 1) for lead in ("/", "")
            for name in ("MASTER_ADDR", "MASTER_PORT")]
    refused = [prewrite(guard.port, version, k, "10.66.66.66") for k in keys]
    assert all(refused), f"the intruder's early writes were not refused: {list(zip(keys, refused))}"
    out = tmp_path / "job-out"
    job = Job(procs, version, guard.port, tmp_path, run_id, out, max_restarts=1, fail_once=1, seconds=1)
    rc = job.wait(180)
    assert rc == 0 and not result_problems(out, 2), f"rc {rc} {result_problems(out, 2)}\n{job.tail()}"
    time.sleep(0.5)
    evs = [e for e in guard.events() if e.get("event.reason") == "key_write_once"]
    assert len(evs) == len(keys) and {e.get("source.ip") for e in evs} == {"127.0.0.66"}, \
        f"the audit does not name the intruder's {len(keys)} writes: {[(e.get('source.ip'), e.get('storeguard.key')) for e in evs]}"
    others = [(e.get("event.action"), e.get("event.reason"), e.get("source.ip")) for e in guard.events()
              if e.get("source.ip") != "127.0.0.66"]
    assert not others, f"the job's own traffic was refused: {others}"
    reached = [(op, k) for _, op, k, v in relay_writes(relay, version) if v == b"10.66.66.66"]
    assert not reached, f"the intruder's writes reached the store: {reached}"


# --- no false positive: a new job on the same port, with the same run id ------------------------------

@pytest.mark.parametrize("generation", ["auto", "2.15"])
def test_next_job_on_a_restarted_store_no_policy_violation(procs, binary, tmp_path, generation):
    """Two torchrun jobs one after the other through one long-lived guard, with the same --rdzv_id (torchrun's
    default is "none"), the store restarted between them on the same port, as a job's master does: the second
    job's round 0 writes MASTER_ADDR, MASTER_PORT and the rest again, to a store that holds none of them. It
    succeeds with 0 violations, whether the guard saw the store go (generation auto: its idle connection
    closed) or not (a generation configured: the store, asked, no longer has the keys)."""
    version = "2.15.0"
    if version not in ENVS:
        pytest.skip(f"torch {version} is not installed")
    store, sport = start_store(procs, version, default_backend(version))
    guard = Guard(procs, binary, sport, generation, tmp_path)
    wait_ready(guard.mport, "the guard")
    for i in range(2):
        out = tmp_path / f"job{i}-out"
        job = Job(procs, version, guard.port, tmp_path, "none", out, name=f"job{i}", seconds=1)
        rc = job.wait(180)
        assert rc == 0 and not result_problems(out, 2), f"job {i}: rc {rc} {result_problems(out, 2)}\n{job.tail()}\n" \
                                                        f"guard events: {guard.events()}"
        if i == 0:
            store.terminate()
            store.wait(15)
            store, _ = start_store(procs, version, default_backend(version), port=sport)
            wait_ready(guard.mport, "the guard after the store's restart")
    guard.assert_clean()
