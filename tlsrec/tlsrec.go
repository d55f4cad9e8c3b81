// Package tlsrec is a TLS 1.3 connection whose record state is plain data. crypto/tls runs the
// handshake (Server, Client); then the records are read and written here, with the traffic
// secrets crypto/tls reports through its key log and the sequence numbers counted here, so that
// a connection can change hands (an upgrade in place, a keeper's restart) as bytes: State.
//
// crypto/tls cannot export a live connection, and kernel TLS (kTLS), which would hold the state,
// is not built into every kernel. What this package takes from crypto/tls is only what RFC 8446
// §7.1 defines: after the handshake, each direction is a traffic secret and a sequence number
// that starts at 0, or, on a server that resumes sessions, at the number of NewSessionTickets
// crypto/tls sent under the application keys before the hand-off (Server counts them).
package tlsrec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"golang.org/x/crypto/chacha20poly1305"
)

// Record content types (RFC 8446 §5.1).
const (
	typeChangeCipherSpec = 20
	typeAlert            = 21
	typeHandshake        = 22
	typeApplicationData  = 23
)

const (
	headerLen = 5
	// MaxPlaintext is the most plaintext one record carries.
	MaxPlaintext = 16384
	// maxCiphertext is the longest record body TLS 1.3 allows: plaintext, its content type and
	// up to 255 bytes of AEAD expansion (§5.2).
	maxCiphertext = MaxPlaintext + 256
	// MaxRecord is the longest record on the wire, header included.
	MaxRecord = headerLen + maxCiphertext
)

// State is one direction pair of a TLS 1.3 connection after its handshake, as plain data: what
// the next owner of the connection needs to read and write its records.
type State struct {
	Suite     uint16 // tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384 or tls.TLS_CHACHA20_POLY1305_SHA256
	InSecret  []byte // the peer's traffic secret: records read
	OutSecret []byte // ours: records written
	InSeq     uint64
	OutSeq    uint64
	// UpdateOwed: the peer asked for a KeyUpdate, owed before our next record.
	UpdateOwed bool `json:",omitempty"`
}

// direction is one side's keys: an AEAD, its IV and the next sequence number.
type direction struct {
	secret []byte
	aead   cipher.AEAD
	iv     [12]byte
	seq    uint64
	nonce  [12]byte
}

func suiteHash(suite uint16) (func() hash.Hash, int, error) {
	switch suite {
	case tls.TLS_AES_128_GCM_SHA256:
		return sha256.New, 16, nil
	case tls.TLS_AES_256_GCM_SHA384:
		return sha512.New384, 32, nil
	case tls.TLS_CHACHA20_POLY1305_SHA256:
		return sha256.New, chacha20poly1305.KeySize, nil
	}
	return nil, 0, fmt.Errorf("tlsrec: cipher suite %#04x is not a TLS 1.3 suite", suite)
}

// expandLabel is HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
func expandLabel(h func() hash.Hash, secret []byte, label string, n int) []byte {
	info := make([]byte, 0, 4+len("tls13 ")+len(label))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(len("tls13 ")+len(label)))
	info = append(info, "tls13 "...)
	info = append(info, label...)
	info = append(info, 0) // empty context
	out, err := hkdf.Expand(h, secret, string(info), n)
	if err != nil {
		panic("tlsrec: HKDF-Expand-Label: " + err.Error()) // only for n beyond 255 hash lengths
	}
	return out
}

func (d *direction) set(suite uint16, secret []byte, seq uint64) error {
	h, keyLen, err := suiteHash(suite)
	if err != nil {
		return err
	}
	if len(secret) != h().Size() {
		return fmt.Errorf("tlsrec: a traffic secret of %d bytes for suite %#04x", len(secret), suite)
	}
	key := expandLabel(h, secret, "key", keyLen)
	if suite == tls.TLS_CHACHA20_POLY1305_SHA256 {
		d.aead, err = chacha20poly1305.New(key)
	} else {
		var b cipher.Block
		if b, err = aes.NewCipher(key); err == nil {
			d.aead, err = cipher.NewGCM(b)
		}
	}
	if err != nil {
		return err
	}
	d.secret = append(d.secret[:0], secret...)
	copy(d.iv[:], expandLabel(h, secret, "iv", 12))
	d.seq = seq
	return nil
}

// update moves the direction to its next traffic secret (KeyUpdate, §7.2).
func (d *direction) update(suite uint16) error {
	h, _, err := suiteHash(suite)
	if err != nil {
		return err
	}
	return d.set(suite, expandLabel(h, d.secret, "traffic upd", h().Size()), 0)
}

func (d *direction) nextNonce() []byte {
	d.nonce = d.iv
	for i := 0; i < 8; i++ {
		d.nonce[4+i] ^= byte(d.seq >> (56 - 8*i))
	}
	d.seq++
	return d.nonce[:]
}

// Session reads and writes one connection's records. Its read half (Open) and write half
// (Seal, the KeyUpdate it owes) may run on two goroutines at once; UpdateOwed is the one thing
// they share (the read half sets it, the write half clears it), and State must not run
// concurrently with either.
type Session struct {
	in   Half
	out  Half
	owed chan struct{} // a token: the peer asked for a KeyUpdate
	// Ticket, on a client that resumes sessions (Client sets it), takes the peer's first
	// record when it carries a NewSessionTicket, sealed as it came: crypto/tls opens it and
	// caches the session for the next handshake. Whoever reads the records (Open, a relay)
	// calls it at most once, for record 0 alone, and drops it.
	Ticket func(rec []byte)
}

// New builds a session from its state.
func New(st State) (*Session, error) {
	s := &Session{owed: make(chan struct{}, 1)}
	if err := s.in.set(st.Suite, st.InSecret, st.InSeq); err != nil {
		return nil, err
	}
	if err := s.out.set(st.Suite, st.OutSecret, st.OutSeq); err != nil {
		return nil, err
	}
	if st.UpdateOwed {
		s.owed <- struct{}{}
	}
	return s, nil
}

// State is the session as data. Neither half may run meanwhile.
func (s *Session) State() State {
	st := State{Suite: s.in.suite, InSecret: s.in.Secret(), OutSecret: s.out.Secret(), InSeq: s.in.d.seq, OutSeq: s.out.d.seq}
	select {
	case <-s.owed:
		st.UpdateOwed = true
		s.owed <- struct{}{}
	default:
	}
	return st
}

// Seal appends p to dst as application data records, after the KeyUpdate the session owes, if
// it owes one.
func (s *Session) Seal(dst, p []byte) []byte {
	dst = s.payOwed(dst)
	for len(p) > 0 {
		n := min(len(p), MaxPlaintext)
		dst = s.out.SealData(dst, p[:n])
		p = p[n:]
	}
	return dst
}

func (s *Session) payOwed(dst []byte) []byte {
	select {
	case <-s.owed:
		dst = s.out.SealKeyUpdate(dst)
	default:
	}
	return dst
}

// CloseNotify appends a close_notify alert.
func (s *Session) CloseNotify(dst []byte) []byte {
	return s.out.SealClose(s.payOwed(dst))
}

// ErrClosed: the peer sent close_notify.
var ErrClosed = errors.New("tlsrec: the peer closed the connection (close_notify)")

// AlertError is a fatal alert from the peer.
type AlertError uint8

func (e AlertError) Error() string { return fmt.Sprintf("tlsrec: the peer sent alert %d", uint8(e)) }

// RecordLen reports the length of the record starting buf, header included, or 0 if buf does not
// hold its header yet; an error for a record no TLS 1.3 peer sends.
func RecordLen(buf []byte) (int, error) {
	if len(buf) < headerLen {
		return 0, nil
	}
	n := int(buf[3])<<8 | int(buf[4])
	if buf[1] != 3 || n > maxCiphertext {
		return 0, fmt.Errorf("tlsrec: a record header % x that TLS 1.3 does not send", buf[:headerLen])
	}
	return headerLen + n, nil
}

// Open decrypts the whole records at the start of buf in place and returns the application data
// they carried, which aliases buf, and how many bytes of buf they took: what follows is the
// start of a record still arriving. Post-handshake messages are handled (a NewSessionTicket is
// dropped; a KeyUpdate moves the read keys, and one asked for becomes owed by the write half).
// At the peer's close_notify, err is ErrClosed and used covers it.
func (s *Session) Open(buf []byte) (plain []byte, used int, err error) {
	w := 0 // application data is compacted to buf[:w]
	for {
		n, err := RecordLen(buf[used:])
		if err != nil {
			return buf[:w], used, err
		}
		if n == 0 || used+n > len(buf) {
			return buf[:w], used, nil
		}
		content, asked, err := s.in.OpenTicket(buf[used:used+n], &s.Ticket)
		if err != nil && !errors.Is(err, ErrClosed) {
			return buf[:w], used, err
		}
		used += n
		if err != nil {
			return buf[:w], used, err
		}
		w += copy(buf[w:], content)
		if asked {
			select {
			case s.owed <- struct{}{}:
			default:
			}
		}
	}
}

// Half is one direction of a connection: its keys and next sequence number. The read half opens
// the peer's records one at a time, the write half seals ours; Secret and Seq are its state.
type Half struct {
	suite   uint16
	d       direction
	tickets int // NewSessionTickets opened
}

// NewHalf is a direction of suite at traffic secret and sequence number seq.
func NewHalf(suite uint16, secret []byte, seq uint64) (*Half, error) {
	h := &Half{}
	if err := h.set(suite, secret, seq); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *Half) set(suite uint16, secret []byte, seq uint64) error {
	h.suite = suite
	return h.d.set(suite, secret, seq)
}

// Secret is a copy of the current traffic secret.
func (h *Half) Secret() []byte { return append([]byte(nil), h.d.secret...) }

// Seq is the next record's sequence number.
func (h *Half) Seq() uint64 { return h.d.seq }

// OpenRecord decrypts rec, one whole record, in place and returns the application data it
// carried (none for a post-handshake message or a ChangeCipherSpec), which aliases rec. A
// NewSessionTicket is dropped (OpenTicket can give it to crypto/tls); a KeyUpdate moves the
// keys, asked: the peer asked for ours to move too. At the peer's close_notify, err is ErrClosed.
func (h *Half) OpenRecord(rec []byte) (plain []byte, asked bool, err error) {
	typ := rec[0]
	if typ == typeChangeCipherSpec { // a middlebox-compatibility record: never encrypted, no meaning
		return nil, false, nil
	}
	if typ != typeApplicationData {
		return nil, false, fmt.Errorf("tlsrec: an unencrypted record of type %d after the handshake", typ)
	}
	nonce := h.d.nextNonce()
	inner, err := h.d.aead.Open(rec[headerLen:headerLen], nonce, rec[headerLen:], rec[:headerLen])
	if err != nil {
		return nil, false, fmt.Errorf("tlsrec: record %d does not decrypt: %w", h.d.seq-1, err)
	}
	// The inner content type is the last non-zero byte (§5.4).
	i := len(inner) - 1
	for i >= 0 && inner[i] == 0 {
		i--
	}
	if i < 0 {
		return nil, false, errors.New("tlsrec: a record with no content type")
	}
	content := inner[:i]
	switch inner[i] {
	case typeApplicationData:
		return content, false, nil
	case typeAlert:
		if len(content) == 2 && content[1] == 0 {
			return nil, false, ErrClosed
		}
		if len(content) == 2 {
			return nil, false, AlertError(content[1])
		}
		return nil, false, errors.New("tlsrec: a malformed alert")
	case typeHandshake:
		asked, err := h.postHandshake(content)
		return nil, asked, err
	}
	return nil, false, fmt.Errorf("tlsrec: an inner content type %d", inner[i])
}

// OpenTicket is OpenRecord for the reader of a session that holds its Ticket: the first sealed
// record, if it is record 0 and carries a NewSessionTicket, goes to *ticket as it came before it
// is opened here; *ticket is dropped after that record either way.
func (h *Half) OpenTicket(rec []byte, ticket *func([]byte)) (plain []byte, asked bool, err error) {
	if *ticket == nil || rec[0] != typeApplicationData {
		return h.OpenRecord(rec)
	}
	give, first := *ticket, h.d.seq == 0
	*ticket = nil // the server's first record is its ticket, or no ticket comes to take
	var sealed []byte
	if first {
		sealed = append(sealed, rec...)
	}
	before := h.tickets
	plain, asked, err = h.OpenRecord(rec)
	if first && err == nil && h.tickets > before {
		give(sealed)
	}
	return plain, asked, err
}

// postHandshake handles the handshake messages of one record (a peer does not split them
// across records after the handshake: Go and OpenSSL send each whole).
func (h *Half) postHandshake(p []byte) (asked bool, err error) {
	for len(p) > 0 {
		if len(p) < 4 {
			return asked, errors.New("tlsrec: a handshake message cut short")
		}
		n := int(p[1])<<16 | int(p[2])<<8 | int(p[3])
		if len(p) < 4+n {
			return asked, errors.New("tlsrec: a handshake message split across records")
		}
		body := p[4 : 4+n]
		switch p[0] {
		case 4: // NewSessionTicket: Session.Ticket gives crypto/tls the first; the rest are dropped
			h.tickets++
		case 24: // KeyUpdate
			if n != 1 || body[0] > 1 {
				return asked, errors.New("tlsrec: a malformed KeyUpdate")
			}
			if err := h.d.update(h.suite); err != nil {
				return asked, err
			}
			asked = asked || body[0] == 1
		default:
			return asked, fmt.Errorf("tlsrec: a post-handshake message of type %d", p[0])
		}
		p = p[4+n:]
	}
	return asked, nil
}

// seal appends one record of type typ carrying p (at most MaxPlaintext bytes).
func (h *Half) seal(dst []byte, typ byte, p []byte) []byte {
	n := len(p) + 1 + h.d.aead.Overhead()
	dst = append(dst, typeApplicationData, 3, 3, byte(n>>8), byte(n))
	hdr := len(dst) - headerLen
	body := len(dst)
	dst = append(dst, p...)
	dst = append(dst, typ)
	nonce := h.d.nextNonce()
	return h.d.aead.Seal(dst[:body], nonce, dst[body:], dst[hdr:body])
}

// SealData appends one application data record carrying p (at most MaxPlaintext bytes). The
// same p at the same state seals to the same bytes.
func (h *Half) SealData(dst, p []byte) []byte { return h.seal(dst, typeApplicationData, p) }

// SealKeyUpdate appends a KeyUpdate (update_not_requested) and moves the keys.
func (h *Half) SealKeyUpdate(dst []byte) []byte { return h.sealUpdate(dst, 0) }

func (h *Half) sealUpdate(dst []byte, request byte) []byte {
	dst = h.seal(dst, typeHandshake, []byte{24, 0, 0, 1, request})
	if err := h.d.update(h.suite); err != nil {
		panic(err) // the suite was checked when the half was made
	}
	return dst
}

// SealClose appends a close_notify alert.
func (h *Half) SealClose(dst []byte) []byte { return h.seal(dst, typeAlert, []byte{1, 0}) }

// RequestUpdate appends a KeyUpdate asking the peer to update too, and moves the write keys
// (tests; an operator's rekey).
func (s *Session) RequestUpdate(dst []byte) []byte { return s.out.sealUpdate(dst, 1) }
