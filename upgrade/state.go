// Package upgrade is the wire protocol of an upgrade in place: the serving process (Old) hands its
// listening sockets, its state and every connection to the process taking over (Next) over a
// SOCK_SEQPACKET socket pair (internal/fdpass), descriptors with SCM_RIGHTS. In order:
//
//	new → old  R  ready: the new process loaded its configuration (WaitReady, Join)
//	old        freezes every connection; on failure it thaws and says X (Old.Refuse)
//	old → new  S  the server's state, with the listening sockets (ServerState)
//	old → new  C  one connection's state, with its client's and (if connected) store's socket,
//	           then B packets carrying its bytes: the message in progress and what was not judged
//	           yet (refed to the new guard), for the store, for the client (Conn)
//	old → new  E  the end, with the count
//	new → old  A  acknowledged: everything was taken
//	old → new  G  go: the old process forwards nothing more and exits (Old.Go)
//
// The new process forwards nothing before G: until then the old one may still thaw. If the new
// process fails before A (or the old one waits for A in vain: it then kills the new one first),
// the old one thaws and goes on serving. Once it has sent G it exits.
//
// The package moves plain data: the caller freezes its connections and turns each into a Conn, and
// on the other side turns each Conn back into a connection. Linux only; elsewhere WaitReady and
// Join fail with ErrNeedsLinux.
package upgrade

import (
	"errors"
	"net/netip"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/storeinfo"
	"github.com/storeguard/storeguard/tlsrelay"
)

// Ready is the new process's R.
type Ready struct {
	PID     int
	Version string
	// Ledger: this process can take a keeper's shared ledger of TLS relays (ServerState.Ledger).
	// A build from before it leaves it false, and gets none.
	Ledger bool `json:",omitempty"`
	// KeptEnds: this process takes a kept TLS End from its slot in that ledger (TLSConn.Kept). A
	// build from before it is handed each as a relay.
	KeptEnds bool `json:",omitempty"`
	// SocketHolds: this process takes the start of a message left in a client's socket as its
	// own hold (Conn.InSocket). A build from before it gets those bytes consumed, in Refeed only.
	SocketHolds bool `json:",omitempty"`
}

// ServerState is the S packet: what the whole server carries over, with the listening sockets
// (Fds). Old.Send fills in PID and Version.
type ServerState struct {
	PID           int
	Version       string
	Listen        string // the listening socket's address (the first descriptor)
	MetricsListen string // the metrics listener's, if any (the second)
	NextID        uint64
	StoreKnown    bool
	Store         storeinfo.Info
	Sources       []admission.SourceState
	// Proven: identities' violations and bans at addresses (admission.ProvenStates), apart from
	// Sources so that a build before them never takes one for its address's.
	Proven    []admission.ProvenState `json:",omitempty"`
	Handovers uint64                  // hand-overs before this one
	Conns     int
	Frozen    time.Time // when the old process stopped forwarding (handover_frozen_seconds)
	// Ledger: the last of Fds is the TLS relays' ledger, shared with a keeper, in which each TLS
	// connection's relay goes on from its slot (TLSConn.Slot): at no instant does the keeper hold
	// a slot that is not its connection's. Sent only to a process that said Ready.Ledger.
	Ledger bool `json:",omitempty"`
	// Fds are the listening socket's descriptor, then the metrics listener's when MetricsListen is
	// set, then the ledger's when Ledger is. Next's are its own to close.
	Fds []int `json:"-"`
}

// AddLedger makes st carry the shared ledger fd (a keeper's; -1: none) if the new process takes it.
func (o *Old) AddLedger(st *ServerState, fd int) {
	if fd >= 0 && o.Peer.Ledger {
		st.Ledger, st.Fds = true, append(st.Fds, fd)
	}
}

// TakeLedger is the descriptor of the shared ledger the old process sent, taken out of From.Fds
// (the caller's to close), or -1.
func (n *Next) TakeLedger() int {
	fds := n.From.Fds
	if !n.From.Ledger || len(fds) < 2 {
		return -1
	}
	n.From.Fds = fds[:len(fds)-1]
	return fds[len(fds)-1]
}

// Conn is one frozen connection: the C packet's body, its sockets and its bytes.
type Conn struct {
	ID         uint64
	Src, Dst   netip.AddrPort
	Start      time.Time
	Guard      guard.StreamState
	Replies    protocol.RepliesState
	ReadEnded  bool // the client's end of stream was passed on; the store's last replies are awaited
	UpDeadline time.Time
	// Held is the budget the message in progress held (its carry's capacity), taken again at
	// once by the new process: a connection that had its budget keeps it, and one that waited
	// for budget waits again, behind it.
	Held int64
	Flow Flow
	// ClientFd and StoreFd are its sockets (-1: none; the store's when it is not connected), the
	// sender's to close, the receiver's to own.
	ClientFd, StoreFd int `json:"-"`
	// Refeed is the message in progress and unjudged bytes: fed to the guard again. ToStore is
	// judged, for the store; ToClient the store's replies the client has not taken.
	Refeed, ToStore, ToClient []byte `json:"-"`
	// InSocket: Refeed's first InSocket bytes (the start of the message in progress) are also
	// still at the head of the client's socket, unconsumed (the sender's hold, for a keeper's
	// restart: proxy/client.go: hold); the receiver takes them as its own hold. 0: none are.
	InSocket int `json:",omitempty"`
	// TLS: a mutual-TLS connection's relay; nil for plaintext.
	TLS *TLSConn `json:",omitempty"`
}

// TLSConn is a mutual-TLS connection's relay (tlsrelay) as data: its state (keys, sequence
// numbers, where each direction stands in its two byte streams) and who the peer proved to be.
// Its descriptors, when it has its own (Fd >= 0), follow the connection's: the TLS socket (Fd),
// then the relay's end of the loopback pair (PlainFd); a client guard's relay has none but the
// connection's (its client's socket and, as the store's, the master's). Its bytes (Relay.Rx,
// the start of a record read) follow the connection's.
type TLSConn struct {
	Relay tlsrelay.State
	// Slot is the relay's slot in the shared ledger (ServerState.Ledger); -1: its state is Relay's
	// alone (a ledger of its own), and the new process resumes it in a slot of its own.
	Slot int
	// Kept: an End whose state is in Slot (tlsrelay.End.HandOff): the connection's client socket
	// is its TLS socket, it has no descriptors of its own, and Relay is where it stopped. Sent
	// only to a process that said Ready.KeptEnds.
	Kept        bool `json:",omitempty"`
	Identity    string
	Info        *audit.TLS
	Fd, PlainFd int `json:"-"`
}

// Flow is a flow's account as an upgrade carries it to the new process.
type Flow struct {
	FromClient, ToStore, FromStore, Replied uint64
	First                                   []byte
	Verdict                                 audit.Verdict
	Reason                                  string
	Interim                                 time.Time
}

// connPacket is a C packet: the lengths of the bytes that follow stand for them.
type connPacket struct {
	Conn
	HasUp                     bool
	Refeed, ToStore, ToClient int
	TLSRx                     int `json:",omitempty"`
	// Sent by storeguard before relay ledgers (plaintext and records a relay had not written):
	// read and dropped. Such a relay cannot go on (its state has no stream counters).
	TLSToPlain, TLSToTLS int  `json:",omitempty"`
	TLSFds               bool `json:",omitempty"` // the TLS relay's two sockets follow the connection's
}

const (
	readyTimeout = 60 * time.Second // for the new process to load its configuration and say R
	ackTimeout   = 60 * time.Second
)

// ErrUnderWay: an upgrade was asked for while one is under way; that one's outcome stands.
var ErrUnderWay = errors.New("an upgrade is under way already")

// ErrNeedsLinux: upgrade in place passes descriptors between processes.
var ErrNeedsLinux = errors.New("upgrade in place needs Linux")

// peerError is a hand-over that failed after the new process may have taken connections: the
// caller stops that process before the old one thaws (Thaw), so that no connection is forwarded by
// both.
type peerError struct {
	err  error
	thaw func()
}

func (e *peerError) Error() string { return e.err.Error() }
func (e *peerError) Unwrap() error { return e.err }

// Thaw goes on serving after a failed hand-over, once the new process is gone. Errors that are not
// from Old.Send were thawed already.
func Thaw(err error) {
	var pe *peerError
	if errors.As(err, &pe) {
		pe.thaw()
	}
}

// MayHaveTaken reports whether err, from a hand-over, came after the new process may have taken
// connections: it must be gone before Thaw.
func MayHaveTaken(err error) bool {
	var pe *peerError
	return errors.As(err, &pe)
}
