// Package probename names the scanner probe or stray client behind a connection's first bytes,
// for the storeguard.probe field of a blocked connection's audit event.
//
// A name is a label for the audit log, not a verdict: the guard has already decided from the
// protocol package. It is derived only from the bytes, matched against a table whose entries come
// from captures of the tools themselves (testdata/observed.json: nmap 7.93 -sV, --version-all and
// -sC, masscan --banners, curl, wget, openssl s_client, redis-cli, ssh).
//
// # Names
//
// Names are short, lower-case snake case, and stable: a name once shipped keeps its meaning.
//
//   - A family name says which protocol the bytes open, whoever sent them: http_get, http_head,
//     http_post, http_options, http (any other method), http2_preface, rtsp_options, rtsp,
//     sip_options, sip, tls_client_hello, ssl2_client_hello, ssh, redis_resp, rdp_x224,
//     smb_negotiate, kerberos, dns_tcp, sunrpc, x11, ldap, java_rmi, ms_wms, smtp_ehlo,
//     smtp_helo, and nmap's content-free probes by their content: generic_lines ("\r\n\r\n") and
//     help ("HELP\r\n"). Families are recognised by structure, so a real curl, openssl or
//     redis-cli gets the same name as nmap's probe of that protocol.
//   - nmap_<probe> is the exact bytes of the nmap service probe <probe> (its name in
//     nmap-service-probes, lower-cased, words joined by "_": TerminalServerCookie is
//     nmap_terminal_server_cookie). It is used where nmap's bytes carry nmap's own marks (a fixed
//     "random", "mstshash=nmap", the realm NM, the path /nice%20ports%2C/Tri%6Eity.txt%2ebak, an
//     RPC call to a nonsense version), and for the probes of protocols outside the families above,
//     which only a scanner is expected to send to a rendezvous port.
//   - masscan_<hello> is masscan's hello with its marks: masscan_http_get (its User-Agent) and
//     masscan_tls_client_hello (its fixed ClientHello).
//
// The more specific name wins: exact tool entries are tried before families.
//
// # When a name is given
//
// A name is given once the bytes that tell it apart have arrived: the whole exact pattern (up to
// MaxPrefix bytes), or the part of a family's first message that a more specific entry could
// still differ in (an HTTP request's header block, a TLS ClientHello's random, a whole RDP
// connection request), or MaxPrefix bytes. So a shorter prefix of a probe is named the same or
// not at all, never something else.
//
// # Never a name for torch traffic
//
// Name returns "" for every byte string a real TCPStore client can begin a connection with. A
// torch >= 2.2 client begins with VALIDATE (00 CE F7 85 3C), which no entry matches. A torch
// <= 2.1 client begins with an opcode 0..11 and, for all but GET_NUM_KEYS and CANCEL_WAIT, a
// little-endian u64 key length or key count. Whatever Name names breaks protocol.DefaultLimits
// (8 KiB keys, 128 Ki keys per list) under every generation within the bytes it was named on,
// even when the bytes end inside a length, which then counts as its smallest completion: nmap's
// TerminalServer probe, 03 00 00 0b 06 e0 00 00 00 00 00, reads as an ADD of a 962 GB key (PyTorch
// issue #106294). The tests hold every entry and every named capture prefix to this with the
// protocol package's decoder, and FuzzName holds every named input to it. One nmap probe fails
// it and is left unnamed: insteonPLM, 02 60, which is also how a GET of a 96-byte key begins.
package probename

// MaxPrefix is how many first bytes Name may look at (callers keep at least this many; 64).
const MaxPrefix = 64

// Name returns the name of the probe whose first bytes are first (the client's first bytes on the
// connection, up to 64 of them; may be fewer when the client sent fewer), or "" when first is
// not recognised (including empty input and genuine TCPStore messages).
func Name(first []byte) string {
	b := first[:min(len(first), MaxPrefix)]
	if len(b) == 0 {
		return ""
	}
	for _, e := range exactByFirst[b[0]] {
		if e.matches(b) {
			return e.name
		}
	}
	for i := range families {
		if name := families[i](b); name != "" {
			return name
		}
	}
	return ""
}

// Known reports whether name is one that Name gives. A reader of audit logs shows only those: a log
// may come from anywhere, and one edited by hand can put any string where a probe's name goes.
func Known(name string) bool { return known[name] }

var known = func() map[string]bool {
	m := make(map[string]bool)
	for _, e := range exacts {
		m[e.name] = true
	}
	for _, r := range requestNames {
		m[r.name] = true
	}
	for _, n := range familyNames {
		m[n] = true
	}
	return m
}()

// exact is a tool's probe matched on its bytes.
type exact struct {
	name string
	pat  string // the probe's first bytes, at most MaxPrefix of them
}

// matches reports whether b begins with the whole of pat.
func (e *exact) matches(b []byte) bool {
	if len(b) < len(e.pat) {
		return false
	}
	return string(b[:len(e.pat)]) == e.pat
}

// exactByFirst indexes exacts by first byte, in table order.
var exactByFirst = func() (t [256][]exact) {
	for _, e := range exacts {
		if len(e.pat) == 0 || len(e.pat) > MaxPrefix {
			panic("probename: pattern of " + e.name + " is empty or longer than MaxPrefix")
		}
		t[e.pat[0]] = append(t[e.pat[0]], e)
	}
	return t
}()
