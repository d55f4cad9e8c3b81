#!/usr/bin/env python3
"""Turns capture-all.sh's logs into observed.json: one vector per distinct first-bytes string.

The bytes are what the listener received. nmap's own probe file only labels them: a vector whose
bytes equal a TCP probe of /usr/share/nmap/nmap-service-probes gets that probe's name and rarity.
Bytes that match no probe come from NSE scripts, named by hand below after running nmap with -d
(which prints "NSE: Starting <script> against <port>"). `want` is the name probename.Name must
give; it is written here, by hand, from the naming scheme in the package doc.

    build-observed.py LOGDIR > observed.json
"""
import glob
import json
import os
import re
import subprocess
import sys

PROBES = "/usr/share/nmap/nmap-service-probes"

# TOOLS maps a run name to (tool, what it is).
TOOLS = {
    "nmap_sT": "nmap", "nmap_sS": "nmap", "nmap_sV": "nmap", "nmap_sV_version_all": "nmap",
    "nmap_sC_sV": "nmap", "curl_http": "curl", "curl_https": "curl", "openssl_s_client": "openssl",
    "redis_cli_ping": "redis-cli", "ssh": "ssh", "curl_http2_prior_knowledge": "curl",
    "curl_head": "curl", "curl_post": "curl", "curl_options": "curl", "wget": "wget",
    "masscan_banners": "masscan", "masscan_hello_http": "masscan", "masscan_hello_ssl": "masscan",
    "masscan_hello_smbv1": "masscan",
}

# WANT: nmap probe name -> the name probename.Name gives its bytes. Families first (a real client
# of the protocol sends such bytes too), then probes that carry nmap's own marks, then the probes
# of protocols outside the families, named nmap_<probe>.
WANT = {
    "GenericLines": "generic_lines", "GetRequest": "http_get", "HTTPOptions": "http_options",
    "RTSPRequest": "rtsp_options", "DNSVersionBindReqTCP": "dns_tcp",
    "DNSStatusRequestTCP": "dns_tcp", "Hello": "smtp_ehlo", "Help": "help",
    "SSLv23SessionReq": "ssl2_client_hello", "SMBProgNeg": "smb_negotiate", "X11Probe": "x11",
    "LDAPSearchReq": "ldap", "LDAPBindReq": "ldap", "TerminalServer": "rdp_x224",
    "JavaRMI": "java_rmi", "WMSRequest": "ms_wms", "redis-server": "redis_resp",
    "OfficeScan": "http_get", "apple-iphoto": "http_get", "metasploit-msgrpc": "http_get",
    "hazelcast-http": "http_get", "docker": "http_get",
    # nmap's marks: a fixed xid and a nonsense version, fixed "random" bytes, its name.
    "RPCCheck": "nmap_rpc_check", "SSLSessionReq": "nmap_ssl_session_req",
    "TLSSessionReq": "nmap_tls_session_req", "TLS-PSK": "nmap_tls_psk",
    "TerminalServerCookie": "nmap_terminal_server_cookie", "Kerberos": "nmap_kerberos",
    "FourOhFourRequest": "nmap_four_oh_four_request", "SIPOptions": "nmap_sip_options",
    # Other protocols.
    "LPDString": "nmap_lpd_string", "LANDesk-RC": "nmap_landesk_rc", "NCP": "nmap_ncp",
    "NotesRPC": "nmap_notes_rpc", "DistCCD": "nmap_distccd", "Radmin": "nmap_radmin",
    "NessusTPv12": "nmap_nessus_tpv12", "NessusTPv11": "nmap_nessus_tpv11",
    "NessusTPv10": "nmap_nessus_tpv10", "oracle-tns": "nmap_oracle_tns", "mydoom": "nmap_mydoom",
    "WWWOFFLEctrlstat": "nmap_wwwoffle_ctrlstat", "Verifier": "nmap_verifier",
    "VerifierAdvanced": "nmap_verifier_advanced", "Socks5": "nmap_socks5", "Socks4": "nmap_socks4",
    "ms-sql-s": "nmap_ms_sql_s", "HELP4STOMP": "nmap_help4stomp", "Memcache": "nmap_memcache",
    "beast2": "nmap_beast2", "firebird": "nmap_firebird", "ibm-db2-das": "nmap_ibm_db2_das",
    "ibm-db2": "nmap_ibm_db2", "pervasive-relational": "nmap_pervasive_relational",
    "pervasive-btrieve": "nmap_pervasive_btrieve", "ajp": "nmap_ajp", "hp-pjl": "nmap_hp_pjl",
    "afp": "nmap_afp", "SqueezeCenter_CLI": "nmap_squeezecenter_cli", "Arucer": "nmap_arucer",
    "dominoconsole": "nmap_dominoconsole", "informix": "nmap_informix", "drda": "nmap_drda",
    "ibm-mqseries": "nmap_ibm_mqseries", "ZendJavaBridge": "nmap_zend_java_bridge",
    "gkrellm": "nmap_gkrellm", "metasploit-xmlrpc": "nmap_metasploit_xmlrpc",
    "mongodb": "nmap_mongodb", "riak-pbc": "nmap_riak_pbc", "tarantool": "nmap_tarantool",
    "couchbase-data": "nmap_couchbase_data", "epmd": "nmap_epmd", "vp3": "nmap_vp3",
    "kumo-server": "nmap_kumo_server", "minecraft-ping": "nmap_minecraft_ping",
    "erlang-node": "nmap_erlang_node", "teamspeak-tcpquery-ver": "nmap_teamspeak_tcpquery_ver",
    "xmlsysd": "nmap_xmlsysd", "tor-versions": "nmap_tor_versions", "NJE": "nmap_nje",
    "tn3270": "nmap_tn3270", "giop": "nmap_giop", "OpenVPN": "nmap_openvpn",
    "pcworx": "nmap_pcworx", "proconos": "nmap_proconos", "niagara-fox": "nmap_niagara_fox",
    "mqtt": "nmap_mqtt", "iperf3": "nmap_iperf3", "VersionRequest": "nmap_version_request",
    "NoMachine": "nmap_nomachine", "JMON": "nmap_jmon",
    "LibreOfficeImpressSCPair": "nmap_libreoffice_impress_sc_pair", "LSCP": "nmap_lscp",
    "rotctl": "nmap_rotctl", "SharpTV": "nmap_sharptv", "adbConnect": "nmap_adb_connect",
    "piholeVersion": "nmap_pihole_version", "teamtalk-login": "nmap_teamtalk_login",
    # 02 60 is also how a torch <= 2.1 GET of a 96-byte key begins: left unnamed.
    "insteonPLM": "",
}

# Bytes no probe matches, by run: who sent them (nmap -d names the NSE scripts) and the name.
OTHER = {
    "curl_http": ("curl", "GET, HTTP/1.1", "http_get"),
    "curl_https": ("curl", "TLS ClientHello", "tls_client_hello"),
    "openssl_s_client": ("openssl", "TLS ClientHello", "tls_client_hello"),
    "redis_cli_ping": ("redis-cli", "RESP PING", "redis_resp"),
    "ssh": ("ssh", "SSH identification string", "ssh"),
    "curl_http2_prior_knowledge": ("curl", "HTTP/2 connection preface", "http2_preface"),
    "curl_head": ("curl", "HEAD, HTTP/1.1", "http_head"),
    "curl_post": ("curl", "POST, HTTP/1.1", "http_post"),
    "curl_options": ("curl", "OPTIONS, HTTP/1.1", "http_options"),
    "wget": ("wget", "GET, HTTP/1.1", "http_get"),
    "masscan_hello_http": ("masscan", "--hello=http", "masscan_http_get"),
    "masscan_hello_ssl": ("masscan", "--hello=ssl", "masscan_tls_client_hello"),
}


NOTES = [
    "nmap -sS: the listener accepted no connection (a SYN scan never completes the handshake).",
    "nmap -sT connects and resets at once: a connection with no bytes.",
    "nmap -sV's NULL probe sends nothing and waits 6 s; nmap then sends GenericLines on the same "
    "connection (first_byte_after_s). All other probes get a connection of their own.",
    "nmap -sV also runs the version-category NSE scripts whose portrule accepts an unknown port: "
    "skypev2-version (GET / HTTP/1.0, the GetRequest bytes) and rpc-grind (an RPC NULL call with "
    "a random xid). Under -sC, shortport.ssl sends TLSSessionReq and SSLSessionReq once more.",
    "nmap -sV --version-all sent every TCP probe of nmap-service-probes (99 with bytes, and NULL).",
    "masscan --banners sends nothing to a port it has no hello for (the listener waits 8 s); "
    "--hello=smbv1 sent nothing to this port either. --hello=http and --hello=ssl send fixed "
    "bytes (two runs gave identical hellos), about 2 s after the handshake (first_byte_after_s). "
    "masscan runs its timers only when a packet arrives: without the listener's keepalives it "
    "sent its hello only after the listener gave up and closed.",
    "Commands use -Pn (no host discovery) so that every run scans the port the same way.",
]


def unescape(s):
    out, i = bytearray(), 0
    esc = {"r": 13, "n": 10, "t": 9, "0": 0, "\\": 92, "a": 7, "f": 12, "v": 11, "|": 124}
    while i < len(s):
        if s[i] == "\\":
            c = s[i + 1]
            if c == "x":
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
                continue
            out.append(esc.get(c, ord(c)))
            i += 2
            continue
        out.append(ord(s[i]))
        i += 1
    return bytes(out)


def load_probes():
    probes, cur = [], None
    for line in open(PROBES, encoding="latin-1"):
        if line.startswith("Probe TCP "):
            m = re.match(r"Probe TCP (\S+) q\|(.*)\|", line)
            cur = {"name": m.group(1), "bytes": unescape(m.group(2)), "rarity": None}
            probes.append(cur)
        elif line.startswith("Probe "):
            cur = None
        elif cur and line.startswith("rarity "):
            cur["rarity"] = int(line.split()[1])
    return probes


def label(run, data, probes):
    """Returns (tool, probe, via, want) for one connection's bytes."""
    tool = TOOLS[run]
    if not data:
        return tool, None, "sent nothing", ""
    if tool == "nmap":
        for p in probes:
            if p["bytes"] == data:
                via = "service probe, rarity %s" % p["rarity"]
                return tool, p["name"], via, WANT[p["name"]]
        # nmap -d: "NSE: Starting rpc-grind" and "NSE: Starting skypev2-version"; the random
        # xid makes every rpc-grind call different.
        if data[:4] == b"\x80\x00\x00\x28" and data[12:24] == bytes.fromhex("000000020001 86a000000002".replace(" ", "")):
            return tool, None, "NSE rpc-grind (RPC NULL call to portmapper v2, random xid)", "sunrpc"
        raise SystemExit("%s: unlabelled nmap bytes %s" % (run, data[:40]))
    t, what, want = OTHER[run]
    return t, None, what, want


def first_line(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip().split("\n")
    return [l for l in out if l.strip()][0].strip()


def versions():
    v = {
        "nmap": first_line(["nmap", "--version"]),
        "masscan": first_line(["masscan", "--version"]),
        "curl": first_line(["curl", "--version"]),
        "openssl": first_line(["openssl", "version"]),
        "redis-cli": first_line(["redis-cli", "--version"]),
        "ssh": first_line(["ssh", "-V"]),
        "wget": first_line(["wget", "--version"]),
    }
    pkgs = subprocess.run(["dpkg-query", "-W", "nmap", "masscan", "curl", "openssl", "redis-tools",
                           "openssh-client", "wget"], capture_output=True, text=True).stdout
    v["debian_packages"] = pkgs.strip().replace("\t", " ").split("\n")
    return v


def main():
    logdir = sys.argv[1]
    probes = load_probes()
    runs, vectors, index = {}, [], {}
    for run in TOOLS:
        path = os.path.join(logdir, run + ".log")
        cmd = open(os.path.join(logdir, run + ".cmd")).read().strip()
        conns = [json.loads(l) for l in open(path)]
        runs[run] = {"command": cmd, "connections": len(conns)}
        for c in conns:
            data = bytes.fromhex(c["hex"])
            key = (data, TOOLS[run])
            if key in index:
                v = index[key]
                if run not in v["runs"]:
                    v["runs"].append(run)
                    v["commands"].append(cmd)
                continue
            tool, probe, via, want = label(run, data, probes)
            v = {"tool": tool, "probe": probe, "via": via, "runs": [run], "commands": [cmd],
                 "len": len(data), "hex": data.hex(), "want": want}
            if c.get("first_byte_after_s") is not None and c["first_byte_after_s"] > 1:
                v["first_byte_after_s"] = c["first_byte_after_s"]
            index[key] = v
            vectors.append(v)
    # nmap's service scan sends some probes again from NSE (shortport.ssl sends TLSSessionReq and
    # SSLSessionReq under -sC, skypev2-version sends GetRequest): same bytes, one vector.
    doc = {
        "about": "First bytes each tool sent to a silent listener on 127.0.0.1 "
                 "(probename/testdata/capture.py); see capture-all.sh and build-observed.py.",
        "versions": versions(),
        "notes": NOTES,
        "runs": runs,
        "vectors": vectors,
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
