"""Summarise the headers extracted by scan.sh: QueryType enum, magic, useLibUV default, pyi API."""
import os, re, sys, glob, json
root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/hdrscan/out"
def vkey(v): return tuple(int(x) for x in v.split("."))
res = {}
for v in sorted(os.listdir(root), key=vkey):
    d = f"{root}/{v}/torch/include/torch/csrc/distributed/c10d"
    r = {"headers": sorted(f for f in os.listdir(d) + ["store/" + x for x in (os.listdir(d + "/store") if os.path.isdir(d + "/store") else [])] if "Store" in f or "UV" in f.upper())} if os.path.isdir(d) else {"headers": []}
    allh = ""
    for f in glob.glob(d + "/*.hpp") + glob.glob(d + "/store/*.hpp"):
        allh += f"\n//FILE {os.path.basename(f)}\n" + open(f, errors="replace").read()
    m = re.search(r"enum class QueryType\s*:\s*uint8_t\s*\{(.*?)\};", allh, re.S)
    if m:
        body = re.sub(r"//.*", "", m.group(1))
        names = [x.strip() for x in body.split(",") if x.strip()]
        vals, n = {}, 0
        for nm in names:
            if "=" in nm:
                nm, val = [y.strip() for y in nm.split("=")]; n = int(val, 0)
            vals[nm] = n; n += 1
        r["QueryType"] = vals
    m = re.search(r"validationMagicNumber\s*=\s*(0x[0-9A-Fa-f]+)", allh); r["magic"] = m and m.group(1)
    m = re.search(r"bool\s+useLibUV\s*=\s*(\w+)", allh); r["useLibUV_default"] = m and m.group(1)
    r["MAX_"] = sorted(set(re.findall(r"\bMAX_[A-Z_]+\b", allh)))
    r["hdr_mentions"] = {k: bool(re.search(k, allh)) for k in ["PING", "QUEUE", "LIST", "BARRIER", "clone", "ping", "queuePush", "listKeys", "barrier"]}
    pyi = f"{root}/{v}/torch/_C/_distributed_c10d.pyi"
    if os.path.exists(pyi):
        p = open(pyi).read()
        m = re.search(r"class TCPStore\(Store\):(.*?)\nclass ", p, re.S)
        r["pyi_TCPStore"] = re.findall(r"def (\w+)|(\w+):", m.group(1)) if m else None
        r["pyi_TCPStore"] = [a or b for a, b in r["pyi_TCPStore"]] if m else None
        m = re.search(r"class Store:(.*?)\nclass ", p, re.S)
        r["pyi_Store_methods"] = re.findall(r"def (\w+)", m.group(1)) if m else None
    res[v] = r
for v, r in res.items():
    qt = r.get("QueryType")
    print(v, "hdrs=", ",".join(r["headers"]), "| libuv_default=", r["useLibUV_default"], "| magic=", r["magic"])
    print("   QT:", " ".join(f"{k}={n}" for k, n in qt.items()) if qt else None)
    print("   MAX:", r["MAX_"], "pyi TCPStore:", r.get("pyi_TCPStore"))
    print("   Store methods:", r.get("pyi_Store_methods"))
