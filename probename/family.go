package probename

import (
	"bytes"
	"encoding/binary"
)

// families recognise protocols by structure, tried in order after the exact patterns. Each
// returns the name, or "" when b is not (or not yet) its protocol's opening.
var families = [...]func(b []byte) string{
	requestLine,
	tlsClientHello,
	ssl2ClientHello,
	sunRPC,
	sshIdent,
	redisRESP,
	rdpX224,
	smbNegotiate,
	kerberos,
	dnsTCP,
	ldap,
	x11,
	javaRMI,
	msWMS,
	smtpHello,
}

// familyNames are the names the families give (with requestNames').
var familyNames = [...]string{"http", "rtsp", "sip", "tls_client_hello", "ssl2_client_hello", "sunrpc", "ssh",
	"redis_resp", "rdp_x224", "smb_negotiate", "kerberos", "dns_tcp", "ldap", "x11", "java_rmi", "ms_wms",
	"smtp_ehlo", "smtp_helo"}

// complete reports whether b holds the family's unit of n bytes, or as much of it as Name looks at.
func complete(b []byte, n int) bool { return len(b) >= min(n, MaxPrefix) }

// lineEnd is the index of the first '\n' in b, or -1.
func lineEnd(b []byte) int { return bytes.IndexByte(b, '\n') }

// headersEnd reports whether b holds a blank line: the end of a request's header block.
func headersEnd(b []byte) bool {
	return bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\n\n"))
}

// requestLine names an HTTP, RTSP or SIP request: METHOD SP target SP version CRLF, then headers.
// It waits for the blank line after the headers (or MaxPrefix bytes), because a tool's mark may
// sit in a header (masscan's User-Agent).
func requestLine(b []byte) string {
	i := 0
	for i < len(b) && i <= 16 && 'A' <= b[i] && b[i] <= 'Z' {
		i++
	}
	// PRI is the HTTP/2 preface, named whole by its exact entry; its first 18 bytes alone read as
	// a complete HTTP/1 request.
	if i < 3 || i >= len(b) || b[i] != ' ' || string(b[:i]) == "PRI" {
		return ""
	}
	method, line := b[:i], b[i+1:]
	eol := lineEnd(line)
	if eol >= 0 {
		line = bytes.TrimSuffix(line[:eol], []byte("\r"))
	}
	target, version, hasVersion := bytes.Cut(line, []byte(" "))
	proto := requestProtocol(target, version, hasVersion, eol >= 0)
	switch {
	case proto == "":
		return ""
	case proto == "http" && !hasVersion && eol >= 0:
		// HTTP/0.9: the request line is the whole request.
		if string(method) != "GET" {
			return ""
		}
	case !headersEnd(b) && len(b) < MaxPrefix:
		return ""
	}
	for _, r := range requestNames {
		if r.proto == proto && string(method) == r.method {
			return r.name
		}
	}
	return proto
}

// requestNames name the requests scanners and clients send first; other methods are named by
// their protocol alone.
var requestNames = [...]struct{ proto, method, name string }{
	{"http", "GET", "http_get"}, {"http", "HEAD", "http_head"}, {"http", "POST", "http_post"},
	{"http", "OPTIONS", "http_options"}, {"rtsp", "OPTIONS", "rtsp_options"},
	{"sip", "OPTIONS", "sip_options"},
}

// requestProtocol tells HTTP, RTSP and SIP apart by the version, or by the target when the
// request line is longer than what Name looks at; "" when it is none of them.
func requestProtocol(target, version []byte, hasVersion, lineDone bool) string {
	switch {
	case bytes.HasPrefix(version, []byte("HTTP/")):
		return httpTarget(target)
	case bytes.HasPrefix(version, []byte("RTSP/")):
		return "rtsp"
	case bytes.HasPrefix(version, []byte("SIP/")):
		return "sip"
	case lineDone && hasVersion:
		return "" // a version of some other protocol
	case lineDone:
		return httpTarget(target) // HTTP/0.9
	}
	switch {
	case bytes.HasPrefix(target, []byte("sip:")), bytes.HasPrefix(target, []byte("sips:")):
		return "sip"
	case bytes.HasPrefix(target, []byte("rtsp://")):
		return "rtsp"
	}
	return httpTarget(target)
}

// httpTarget is "http" when target looks like an HTTP request target.
func httpTarget(target []byte) string {
	switch {
	case bytes.HasPrefix(target, []byte("/")), string(target) == "*",
		bytes.HasPrefix(target, []byte("http://")), bytes.HasPrefix(target, []byte("https://")):
		return "http"
	}
	return ""
}

// tlsClientHello: a handshake record (0x16, version 3.x) holding a ClientHello (type 1). It waits
// for the end of the 32-byte random, where nmap's and masscan's fixed hellos differ from a real
// client's.
func tlsClientHello(b []byte) string {
	const throughRandom = 5 + 4 + 2 + 32
	if len(b) < throughRandom || b[0] != 0x16 || b[1] != 3 || b[2] > 4 || b[5] != 1 || b[9] != 3 {
		return ""
	}
	record := int(binary.BigEndian.Uint16(b[3:]))
	hello := int(b[6])<<16 | int(b[7])<<8 | int(b[8])
	if hello < 38 || record < 4+38 {
		return ""
	}
	return "tls_client_hello"
}

// ssl2ClientHello: an SSLv2 CLIENT-HELLO with a two-byte header, as SSLv23 clients send it.
func ssl2ClientHello(b []byte) string {
	if len(b) < 11 || b[0]&0x80 == 0 || b[2] != 1 {
		return ""
	}
	switch binary.BigEndian.Uint16(b[3:]) {
	case 0x0002, 0x0300, 0x0301, 0x0302, 0x0303:
	default:
		return ""
	}
	record := int(b[0]&0x7f)<<8 | int(b[1])
	specs := int(binary.BigEndian.Uint16(b[5:]))
	session := int(binary.BigEndian.Uint16(b[7:]))
	challenge := int(binary.BigEndian.Uint16(b[9:]))
	if specs == 0 || specs%3 != 0 || (session != 0 && session != 16) || challenge < 16 ||
		challenge > 32 || record != 9+specs+session+challenge {
		return ""
	}
	return "ssl2_client_hello"
}

// sunRPC: an ONC RPC call over TCP (RFC 5531): a last-fragment record mark, xid, CALL (0), RPC
// version 2, then program, version and procedure.
func sunRPC(b []byte) string {
	if len(b) < 28 || b[0]&0x80 == 0 || binary.BigEndian.Uint32(b)&0x7fffffff < 40 ||
		binary.BigEndian.Uint32(b[8:]) != 0 || binary.BigEndian.Uint32(b[12:]) != 2 {
		return ""
	}
	return "sunrpc"
}

// sshIdent: the identification string (RFC 4253 4.2) a client sends before anything else.
func sshIdent(b []byte) string {
	if !bytes.HasPrefix(b, []byte("SSH-2.0-")) && !bytes.HasPrefix(b, []byte("SSH-1.99-")) &&
		!bytes.HasPrefix(b, []byte("SSH-1.5-")) {
		return ""
	}
	if lineEnd(b) < 0 && len(b) < MaxPrefix {
		return ""
	}
	return "ssh"
}

// redisRESP: a RESP array of bulk strings, how redis-cli sends every command: "*N\r\n$L\r\n".
func redisRESP(b []byte) string {
	if len(b) == 0 || b[0] != '*' {
		return ""
	}
	i, ok := digitsCRLF(b, 1)
	if !ok || i >= len(b) || b[i] != '$' {
		return ""
	}
	if _, ok := digitsCRLF(b, i+1); !ok {
		return ""
	}
	return "redis_resp"
}

// digitsCRLF reads 1..10 decimal digits and "\r\n" at b[i:], returning the index after them.
func digitsCRLF(b []byte, i int) (int, bool) {
	j := i
	for j < len(b) && j-i < 10 && '0' <= b[j] && b[j] <= '9' {
		j++
	}
	if j == i || j+2 > len(b) || b[j] != '\r' || b[j+1] != '\n' {
		return 0, false
	}
	return j + 2, true
}

// rdpX224: a TPKT (version 3) carrying an X.224 Connection Request (0xE0), how every RDP client
// starts. It waits for the whole request, which may carry a cookie (nmap's says mstshash=nmap).
// As a torch <= 2.1 ADD, the CR code lands in the key length's fifth byte: a key of at least
// 0xE0 << 32 bytes.
func rdpX224(b []byte) string {
	if len(b) < 11 || b[0] != 3 || b[1] != 0 || b[5] != 0xe0 {
		return ""
	}
	n := int(binary.BigEndian.Uint16(b[2:]))
	if n < 11 || int(b[4]) != n-5 || !complete(b, n) {
		return ""
	}
	return "rdp_x224"
}

// smbNegotiate: a NetBIOS session message holding an SMB1 NEGOTIATE (0x72) or an SMB2 NEGOTIATE
// (command 0).
func smbNegotiate(b []byte) string {
	if len(b) < 9 || b[0] != 0 {
		return ""
	}
	switch {
	case string(b[4:8]) == "\xffSMB" && b[8] == 0x72:
		return "smb_negotiate"
	case string(b[4:8]) == "\xfeSMB" && len(b) >= 18 && b[16] == 0 && b[17] == 0:
		return "smb_negotiate"
	}
	return ""
}

// kerberos: a KDC request over TCP (RFC 4120 7.2.2): a 4-byte length, then AS-REQ
// ([APPLICATION 10], 0x6a) or TGS-REQ (0x6c) whose DER length agrees with it. It waits for the
// whole request or MaxPrefix bytes: nmap's marks (the realm NM) lie past byte 32.
func kerberos(b []byte) string {
	if len(b) < 7 || b[0] != 0 || (b[4] != 0x6a && b[4] != 0x6c) {
		return ""
	}
	n := int(binary.BigEndian.Uint32(b))
	var der int
	switch b[5] {
	case 0x81:
		der = 3 + int(b[6])
	case 0x82:
		if len(b) < 8 {
			return ""
		}
		der = 4 + int(binary.BigEndian.Uint16(b[6:]))
	default:
		if b[5] >= 0x80 {
			return ""
		}
		der = 2 + int(b[5])
	}
	if der != n || !complete(b, 4+n) {
		return ""
	}
	return "kerberos"
}

// dnsTCP: a DNS query over TCP (a 2-byte length under 256, then the header): a QUERY with one
// question or a STATUS with none, no answers or authority records, at most one additional (EDNS).
// As a torch <= 2.1 SET the question count lands in the key length's seventh byte (the STATUS
// opcode in its fourth), so it declares at least 2^48 (2^28) bytes.
func dnsTCP(b []byte) string {
	if len(b) < 14 || b[0] != 0 || b[1] < 12 || b[4]&0x80 != 0 {
		return ""
	}
	qd, an, ns, ar := binary.BigEndian.Uint16(b[6:]), binary.BigEndian.Uint16(b[8:]),
		binary.BigEndian.Uint16(b[10:]), binary.BigEndian.Uint16(b[12:])
	if an != 0 || ns != 0 || ar > 1 {
		return ""
	}
	switch opcode := b[4] >> 3 & 0xf; {
	case opcode == 0 && qd == 1, opcode == 2 && qd == 0:
		return "dns_tcp"
	}
	return ""
}

// ldap: an LDAPMessage (a DER SEQUENCE, an INTEGER message id) whose operation is a bind (0x60),
// a search (0x63) or an extended request (0x77, StartTLS).
func ldap(b []byte) string {
	if len(b) < 2 || b[0] != 0x30 {
		return ""
	}
	i := 2
	switch {
	case b[1] == 0x80 || b[1] > 0x84:
		return "" // indefinite, or longer than any first message
	case b[1] > 0x80:
		i += int(b[1] & 0x7f)
	}
	if i+2 > len(b) || b[i] != 2 || b[i+1] < 1 || b[i+1] > 4 {
		return ""
	}
	i += 2 + int(b[i+1])
	if i >= len(b) {
		return ""
	}
	switch b[i] {
	case 0x60, 0x63, 0x77:
		return "ldap"
	}
	return ""
}

// x11: the connection setup an X client sends first: byte order ('l' or 'B'), protocol 11.0.
func x11(b []byte) string {
	if len(b) < 12 || b[1] != 0 || b[10] != 0 || b[11] != 0 {
		return ""
	}
	switch {
	case b[0] == 'l' && string(b[2:6]) == "\x0b\x00\x00\x00",
		b[0] == 'B' && string(b[2:6]) == "\x00\x0b\x00\x00":
		return "x11"
	}
	return ""
}

// javaRMI: the JRMP header, "JRMI", version 1 or 2, then the protocol (stream, single-op,
// multiplex).
func javaRMI(b []byte) string {
	if len(b) < 7 || string(b[:5]) != "JRMI\x00" || (b[5] != 1 && b[5] != 2) ||
		b[6] < 0x4b || b[6] > 0x4d {
		return ""
	}
	return "java_rmi"
}

// msWMS: an MMS (Windows Media Services) command: rep 1, the session id 0xB00BFACE at byte 4 and
// "MMS" at byte 12. As a torch <= 2.1 COMPARE_SET the session id fills the key length's high
// bytes.
func msWMS(b []byte) string {
	if len(b) < 15 || b[0] != 1 || string(b[4:8]) != "\xce\xfa\x0b\xb0" ||
		string(b[12:15]) != "MMS" {
		return ""
	}
	return "ms_wms"
}

// smtpHello: EHLO or HELO, bare or with a domain, as a whole line.
func smtpHello(b []byte) string {
	if len(b) < 5 || (b[4] != ' ' && b[4] != '\r' && b[4] != '\n') ||
		(lineEnd(b) < 0 && len(b) < MaxPrefix) {
		return ""
	}
	switch string(b[:4]) {
	case "EHLO":
		return "smtp_ehlo"
	case "HELO":
		return "smtp_helo"
	}
	return ""
}
