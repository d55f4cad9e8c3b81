#!/usr/bin/env python3
"""Issue #41's attacks with torch's own TCPStore client, judged by what a reader that unpickles a key then runs.

  reader_attack.py GUARD_PORT STORE_PORT MARKER_DIR gadgets|splits|multiget [--value-bytes N]

The writes go through the guard (127.0.0.1:GUARD_PORT); the reader does what vLLM's StatelessProcessGroup does
with what it reads (pickle.loads(store.get(key)), raw or base64) on a connection of its own to the store itself
(127.0.0.1:STORE_PORT: a rank on the master host, past the guard), only for keys the store holds (CHECK first).
Each pickle touches its own marker file in MARKER_DIR when it runs.

  gadgets   every pickle of pickle_gadgets.py, raw and base64, each SET on a connection of its own
  splits    the os.system pickle cut in pieces and sent by APPEND (one connection, two, one byte a time, base64,
            after a SET, the first piece written past the guard)
  multiget  SET one key of --value-bytes, then one MULTI_GET naming it 131,072 times, while another client
            GETs a small key in a loop; then torch's own kind of multi_get (each key once)

Every mode also writes the same values straight to the store (the control: the reader must run those, or the
test proves nothing). Prints one JSON line; exit 0 whatever happened: the test judges.
"""
import argparse
import base64
import datetime
import io
import json
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pickle_gadgets  # noqa: E402


def client(port, timeout=10.0):
    import torch.distributed as dist
    td = datetime.timedelta(seconds=timeout)
    try:
        return dist.TCPStore("127.0.0.1", port, None, False, td, wait_for_workers=False)
    except TypeError:
        return dist.TCPStore("127.0.0.1", port, None, False, td)


def written(store):
    """Run write(store): whether the connection is still open after it (SET and APPEND have no reply)."""
    try:
        store.num_keys()
        return True
    except Exception:  # noqa: BLE001
        return False


def load(data, form):
    """What the reader does with a value, with stdin and stdout kept from the pdb a gadget may start."""
    saved, sys.stdin, sys.stdout = sys.stdout, io.StringIO("continue\n" * 4), io.StringIO()
    try:
        pickle.loads(base64.b64decode(data) if form == "b64" else data)
    except BaseException:  # noqa: BLE001 (it may raise after it ran)
        pass
    finally:
        sys.stdout = saved


def read_back(store_port, keys):
    """The reader: for each (key, form, marker), load the key if the store holds it; which markers appeared."""
    reader = client(store_port)
    ran, held = [], []
    for key, form, marker in keys:
        if hasattr(reader, "check"):
            if not reader.check([key]):
                continue
        else:  # torch 1.13: no CHECK in its API; a WAIT that times out ends its connection
            try:
                reader.wait([key], datetime.timedelta(milliseconds=300))
            except Exception:  # noqa: BLE001
                reader = client(store_port)
                continue
        held.append(key)
        load(reader.get(key), form)
        if os.path.exists(marker):
            ran.append(key)
    return ran, held


def gadgets(a):
    keys, control, stored = [], [], []
    direct = client(a.store_port)
    for name in pickle_gadgets.gadgets("x"):
        for form in ("raw", "b64"):
            marker = os.path.join(a.markers, f"{name}-{form}")
            value = pickle_gadgets.gadgets(marker)[name]
            if form == "b64":
                value = base64.b64encode(value)
            key = f"vllm/broadcast/{name}/{form}"
            try:
                c = client(a.guard_port)
                c.set(key, value)
                if written(c):
                    stored.append(key)
            except Exception:  # noqa: BLE001
                pass
            keys.append((key, form, marker))
            cmarker = marker + "-control"
            cvalue = pickle_gadgets.gadgets(cmarker)[name]
            direct.set("control/" + key, base64.b64encode(cvalue) if form == "b64" else cvalue)
            control.append(("control/" + key, form, cmarker))
    ran, held = read_back(a.store_port, keys)
    control_ran, _ = read_back(a.store_port, control)
    return {"attacks": len(keys), "open_after": stored, "held": held, "ran": ran, "control": len(control),
            "control_ran": len(control_ran)}


def splits(a):
    cases = []
    n = 0

    def case(name, pieces, conns, form="raw"):
        nonlocal n
        n += 1
        marker = os.path.join(a.markers, name)
        value = pickle.dumps(pickle_gadgets.System(f"touch {marker}"), protocol=0) if form == "raw" else None
        if form == "b64":
            value = base64.b64encode(pickle.dumps(pickle_gadgets.System(f"touch {marker}"), protocol=4))
        parts = pieces(value)
        cases.append((name, parts, conns, form, marker))

    case("two_appends_one_connection", lambda v: [v[:2], v[2:]], 1)
    case("two_appends_two_connections", lambda v: [v[:2], v[2:]], 2)
    case("tail_first_two_connections", lambda v: [v[2:], v[:2]], 2)
    case("one_byte_at_a_time", lambda v: [v[i:i + 1] for i in range(len(v))], 1)
    case("base64_in_three", lambda v: [v[:7], v[7:30], v[30:]], 1, form="b64")
    case("set_then_append", lambda v: [v[:5], v[5:]], 2)  # the first piece by SET
    case("head_past_the_guard", lambda v: [v[:2], v[2:]], 1)  # the first piece straight to the store
    keys, control = [], []
    direct = client(a.store_port)
    for name, parts, conns, form, marker in cases:
        key = f"split/{name}"
        clients = []
        try:
            clients = [client(a.guard_port) for _ in range(conns)]
            for i, part in enumerate(parts):
                c = clients[i % conns]
                if name == "set_then_append" and i == 0:
                    c.set(key, part)
                elif name == "head_past_the_guard" and i == 0:
                    direct.append(key, part)  # a writer on the store's host, past the guard
                    time.sleep(0.1)
                else:
                    c.append(key, part)
            for c in clients:
                written(c)
        except Exception:  # noqa: BLE001
            pass
        keys.append((key, form, marker))
        cmarker = marker + "-control"
        cvalue = pickle.dumps(pickle_gadgets.System(f"touch {cmarker}"), protocol=0) if form == "raw" else \
            base64.b64encode(pickle.dumps(pickle_gadgets.System(f"touch {cmarker}"), protocol=4))
        for part in [cvalue[:2], cvalue[2:]]:
            direct.append("control/" + key, part)
        control.append(("control/" + key, form, cmarker))
    time.sleep(0.2)  # what passed has landed
    ran, held = read_back(a.store_port, keys)
    control_ran, _ = read_back(a.store_port, control)
    return {"attacks": len(keys), "held": held, "ran": ran, "control": len(control), "control_ran": len(control_ran)}


def benign(a):
    """A benign client in a process of its own (not behind the attacker's GIL): GET a small key in a loop for
    --seconds; prints the latencies' count and the slowest, in ms."""
    c = client(a.guard_port)
    lat, end = [], time.monotonic() + a.seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        c.get("mg/small")
        lat.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.001)
    return {"benign_ops": len(lat), "benign_max_ms": round(max(lat), 2) if lat else None,
            "benign_p99_ms": round(sorted(lat)[int(len(lat) * 0.99)], 2) if lat else None}


def multiget(a):
    import subprocess
    setter = client(a.guard_port)
    setter.set("mg/big", b"x" * a.value_bytes)
    setter.set("mg/small", b"y")
    loop = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(a.guard_port), str(a.store_port), a.markers,
                             "benign", "--seconds", "6"], stdout=subprocess.PIPE, text=True)
    time.sleep(2.5)  # the benign client's torch import, then its loop, runs before the attack
    attacker = client(a.guard_port, timeout=30)
    t0 = time.perf_counter()
    raised = None
    try:
        attacker.multi_get(["mg/big"] * 131072)
    except Exception as e:  # noqa: BLE001
        raised = f"{type(e).__name__}: {e}"[:300]
    attack_s = time.perf_counter() - t0
    out, _ = loop.communicate(timeout=60)
    res = json.loads(out.strip().splitlines()[-1])
    own = client(a.guard_port).multi_get(["mg/small", "mg/big"])  # torch's own kind: each key once
    res.update(raised=raised, attack_s=round(attack_s, 3), own_ok=[len(v) for v in own] == [1, a.value_bytes])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("guard_port", type=int)
    ap.add_argument("store_port", type=int)
    ap.add_argument("markers")
    ap.add_argument("mode", choices=["gadgets", "splits", "multiget", "benign"])
    ap.add_argument("--value-bytes", type=int, default=8 << 20)
    ap.add_argument("--seconds", type=float, default=6.0)
    a = ap.parse_args()
    import torch
    out = {"gadgets": gadgets, "splits": splits, "multiget": multiget, "benign": benign}[a.mode](a)
    out["torch"] = torch.__version__.split("+")[0]
    print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
