"""Ask a TLS listener of bench/tls-side-by-side.sh whether it takes this client: one line out.

usage: python3 tlsprobe.py HOST:PORT CA_FILE [CERT KEY]     (no CERT: offer no client certificate)

"accepted TLSv1.3 <suite>" when the handshake completes and the server then holds the connection
open waiting for the client's first bytes (as a proxy in front of a store does); "refused: why"
when the handshake fails or the server closes or alerts right after it (TLS 1.3 sends the
client's certificate after the client has finished, so a refusal often comes as the first read).
The server's own certificate must chain to CA_FILE; its name is not checked (the proxies check
chains, storeguard SPIFFE IDs).
"""
import socket
import ssl
import sys


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.load_verify_locations(sys.argv[2])
    if len(sys.argv) > 4:
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            with ctx.wrap_socket(raw) as s:
                s.settimeout(1.0)
                try:
                    data = s.recv(1)
                except socket.timeout:
                    print("accepted", s.version(), s.cipher()[0])
                    return
                print("refused: closed after the handshake" if not data else "refused: unexpected bytes")
    except (ssl.SSLError, OSError) as e:
        print("refused:", getattr(e, "reason", None) or e)


if __name__ == "__main__":
    main()
