// Package probe checks that a deployment blocks hostile TCPStore traffic: it sends one hostile
// message per connection and reports, for each, whether the connection was closed without an
// answer (blocked) or not (exposed).
package probe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// Case is one hostile message.
type Case struct {
	Name        string
	Description string
	// Bytes is what the probe sends; the connection is then read for an answer.
	Bytes []byte
	// Freeze marks a partial message: instead of waiting for a close, the probe checks that a
	// second, valid client still gets answers while the partial message is held open.
	Freeze bool
	// Expected is how many reply bytes the valid handshake in front of the hostile message earns
	// (PING's 4-byte echo from G3 on): a guard forwards the handshake, and the store may answer it
	// before the guard closes the connection.
	Expected int
}

// Options choose the probe's cases.
type Options struct {
	Gen    protocol.Generation
	Limits protocol.Limits // oversize lengths are these plus one
	// Real106294 sends the nmap probe of PyTorch issue #106294 as it is (a 962 GB key length)
	// instead of a length just above the ceiling: only against a guarded store.
	Real106294 bool
	Timeout    time.Duration // how long to wait for a close or an answer
}

// Cases returns the probe's cases for generation g. Oversize lengths are just above the limits,
// so that a store that is not protected wastes kilobytes or megabytes, not the host.
func Cases(o Options) []Case {
	g, lim := o.Gen, o.Limits
	hs := protocol.AppendHandshake(nil, g, 1) // VALIDATE (+PING) where the generation has them
	echo := 0
	if _, ok := protocol.WireOf(g, protocol.OpPing); ok {
		echo = 4
	}
	op := func(op protocol.Op) byte {
		w, _ := protocol.WireOf(g, op)
		return w
	}
	u64 := func(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

	add106294 := cat([]byte{op(protocol.OpAdd)}, u64(nil, lim.MaxKeyBytes+1))
	desc106294 := fmt.Sprintf("the shape of PyTorch #106294 (an ADD whose key length is %d, one over the ceiling)", lim.MaxKeyBytes+1)
	if o.Real106294 {
		add106294 = []byte{0x03, 0x00, 0x00, 0x0b, 0x06, 0xe0, 0x00, 0x00, 0x00, 0x00, 0x00}
		desc106294 = "the nmap TerminalServer probe of PyTorch #106294 as sent (a 962 GB key length in torch <= 2.1)"
	}
	// The partial message goes first: it is no violation until the guard's message deadline, and a
	// guard that bans repeat offenders would otherwise refuse its second, valid client.
	cases := []Case{
		{Name: "partial_message", Description: "a SET that stops inside its key, held open: the store must keep answering others",
			Bytes: cat(hs, []byte{op(protocol.OpSet)}, u64(nil, 100), []byte("abc")), Freeze: true},
		{Name: "issue_106294", Description: desc106294, Bytes: cat(hs, add106294)},
		{Name: "key_too_long", Description: "a SET whose key length is one over the ceiling",
			Bytes: cat(hs, []byte{op(protocol.OpSet)}, u64(nil, lim.MaxKeyBytes+1))},
		{Name: "value_too_long", Description: "a SET whose value length is one over the ceiling",
			Bytes: cat(hs, []byte{op(protocol.OpSet)}, protocol.AppendBytes(nil, []byte("/probe")), u64(nil, lim.MaxValueBytes+1))},
		{Name: "too_many_keys", Description: "a CHECK whose key count is one over the ceiling",
			Bytes: cat(hs, []byte{op(protocol.OpCheck)}, u64(nil, lim.MaxKeys+1))},
		{Name: "unknown_opcode", Description: "an opcode the generation does not have",
			Bytes: cat(hs, []byte{0xFF})},
		{Name: "banner_http", Description: "an HTTP request, as scanners send", Bytes: []byte("GET / HTTP/1.0\r\n\r\n")},
		{Name: "banner_tls", Description: "a TLS ClientHello record header, as scanners send",
			Bytes: []byte{0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03}},
	}
	for i := range cases {
		if len(hs) > 0 && bytes.HasPrefix(cases[i].Bytes, hs) && !cases[i].Freeze {
			cases[i].Expected = echo
		}
	}
	if g.Validated() {
		cases = append(cases,
			Case{Name: "validate_missing", Description: "a GET without the VALIDATE handshake",
				Bytes: cat([]byte{op(protocol.OpGet)}, protocol.AppendBytes(nil, []byte("/probe")))},
			Case{Name: "validate_bad_magic", Description: "VALIDATE with a wrong magic number",
				Bytes: []byte{0x00, 0xde, 0xad, 0xbe, 0xef}})
	}
	if g == protocol.G0 {
		cases = append(cases, Case{Name: "watch_key", Description: "WATCH_KEY, which leaks notifications across connections",
			Bytes: cat([]byte{op(protocol.OpWatchKey)}, protocol.AppendBytes(nil, []byte("/probe")))})
	}
	return cases
}

// Verdict is what happened to one case.
type Verdict string

const (
	Blocked Verdict = "blocked" // closed without an answer (or, for a partial message, the store kept answering)
	Exposed Verdict = "exposed"
)

// Result is one case's outcome.
type Result struct {
	Case        string  `json:"case"`
	Description string  `json:"description"`
	Verdict     Verdict `json:"verdict"`
	Detail      string  `json:"detail"`
}

// Run sends every case to target, one connection each.
func Run(target string, o Options) ([]Result, error) {
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	var out []Result
	for _, c := range Cases(o) {
		r := Result{Case: c.Name, Description: c.Description}
		var err error
		if c.Freeze {
			r.Verdict, r.Detail, err = checkFreeze(target, c.Bytes, o)
		} else {
			r.Verdict, r.Detail, err = checkClose(target, c.Bytes, c.Expected, o.Timeout)
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", c.Name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// checkClose sends b and waits for the peer to close without answering beyond the expected
// handshake reply.
func checkClose(target string, b []byte, expected int, timeout time.Duration) (Verdict, string, error) {
	c, err := net.DialTimeout("tcp", target, timeout)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(b); err != nil {
		// Closed before we finished writing: refused by the guard.
		return Blocked, "closed while sending: " + err.Error(), nil
	}
	var got []byte
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		switch {
		case len(got) > expected:
			return Exposed, fmt.Sprintf("the store answered %x", got[expected:]), nil
		case err == nil:
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			return Exposed, fmt.Sprintf("the connection stayed open for %v: the message was accepted and the store waits for more", timeout), nil
		case errors.Is(err, io.EOF):
			return Blocked, "closed without an answer", nil
		default:
			return Blocked, "closed without an answer: " + err.Error(), nil
		}
	}
}

// checkFreeze holds a partial message open on one connection and checks that another client's
// GETNUMKEYS is still answered: a legacy store that received the partial message would freeze.
func checkFreeze(target string, partial []byte, o Options) (Verdict, string, error) {
	hold, err := net.DialTimeout("tcp", target, o.Timeout)
	if err != nil {
		return "", "", err
	}
	defer hold.Close()
	if _, err := hold.Write(partial); err != nil {
		return Blocked, "closed while sending: " + err.Error(), nil
	}
	time.Sleep(100 * time.Millisecond) // let it reach whatever is behind target
	c, err := net.DialTimeout("tcp", target, o.Timeout)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	req := protocol.AppendHandshake(nil, o.Gen, 7)
	req, _ = protocol.Append(req, o.Gen, protocol.Request{Op: protocol.OpGetNumKeys})
	c.SetDeadline(time.Now().Add(o.Timeout))
	if _, err := c.Write(req); err != nil {
		return "", "", err
	}
	want := 8
	if _, ok := protocol.WireOf(o.Gen, protocol.OpPing); ok {
		want += 4 // the PING echo comes first
	}
	if _, err := io.ReadFull(c, make([]byte, want)); err != nil {
		return Exposed, fmt.Sprintf("another client got no answer within %v while the partial message was held: the store is frozen (%v)", o.Timeout, err), nil
	}
	return Blocked, "another client was answered while the partial message was held", nil
}
