package proxy

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"golang.org/x/sys/unix"
)

// These tests drive a connection into an event loop (event_loop_connections reads 1) and then
// through each way out of it, checking that the bytes each side receives are exactly right. They
// run on loops only (run's loopsOnly): each asserts what a loop does with a connection (adopts it,
// keeps its partial message and deadline, hands it back, holds no goroutine for it), which the
// goroutine path does not do. proxy_test.go sends the same kinds of traffic (partial messages,
// violations, deadlines, budget waits) in both modes.

func (h *harness) loopConns() string { return h.metric("storeguard_event_loop_connections") }

func (h *harness) handbacks(reason string) string {
	return h.metric(`storeguard_event_loop_handbacks_total{reason="` + reason + `"}`)
}

// adopted sends the G3 handshake and waits until a loop forwards the connection.
func (h *harness) adopted(c net.Conn) []byte {
	h.t.Helper()
	hs := protocol.AppendHandshake(nil, protocol.G3, 5)
	if _, err := c.Write(hs); err != nil {
		h.t.Fatal(err)
	}
	eventually(h.t, "the handshake at the store", func() bool { return bytes.Equal(h.store.Received(0), hs) })
	eventually(h.t, "a loop forwarding the connection", func() bool { return h.loopConns() == "1" })
	return hs
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// An upstream given as an address on this host is connected before the client's first byte, and a
// loop forwards from there (connectNow); one given as a name is dialled while the client is read,
// and the handler hands the connection over once the store is up (the kick).
func TestLoopForwardsBothWays(t *testing.T) { run(t, testLoopForwardsBothWays, loopsOnly) }

func testLoopForwardsBothWays(t *testing.T, m mode) {
	for _, byName := range []bool{false, true} {
		t.Run(map[bool]string{false: "connected-at-once", true: "dialled"}[byName], func(t *testing.T) {
			h := start(t, m, func(c *config.Config) {
				c.Generation = "2.6"
				if byName {
					_, port, _ := net.SplitHostPort(c.Upstream)
					c.Upstream = "localhost:" + port
				}
			})
			h.store.SetReply([]byte("ok"))
			c := h.dial()
			sent := h.adopted(c)
			c.SetReadDeadline(time.Now().Add(patience))
			if _, err := io.ReadFull(c, make([]byte, 2)); err != nil { // the store's answer to the handshake
				t.Fatal(err)
			}
			for i := range 50 {
				m := enc(t, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte{'/', byte('a' + i%26)}})
				sent = append(sent, m...)
				c.Write(m)
				got := make([]byte, 2)
				if _, err := io.ReadFull(c, got); err != nil || string(got) != "ok" {
					t.Fatalf("reply %d: %q, %v", i, got, err)
				}
			}
			if got := h.store.Received(0); !bytes.Equal(got, sent) {
				t.Fatalf("store received %d bytes, want the %d sent", len(got), len(sent))
			}
			if v := h.loopConns(); v != "1" {
				t.Errorf("event_loop_connections %q after plain traffic, want 1", v)
			}
			// The client's end of stream: the loop passes the half-close on, and the store's close ends
			// the connection, with no hand-back.
			c.(*net.TCPConn).CloseWrite()
			closedByPeer(t, c)
			eventually(t, "the loop letting the closed connection go", func() bool { return h.loopConns() == "0" })
			for _, reason := range handbackNames {
				if v := h.handbacks(reason); v != "0" {
					t.Errorf("handbacks{%s} %q, want 0", reason, v)
				}
			}
		})
	}
}

// connectLocal reports a store socket only once it is established: a refused connect and a SYN
// the store's full accept queue dropped are errors, for dialStore to retry.
func TestConnectLocal(t *testing.T) {
	ln, err := net.Listen("tcp", reservedAddr(t)) // no other socket takes the port once ln is closed
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(ln.Addr().String())
	fd, err := connectLocal(ap)
	if err != nil {
		t.Fatalf("connect to a listening store: %v", err)
	}
	peer, err := unix.Getpeername(int(fd))
	if sa, ok := peer.(*unix.SockaddrInet4); err != nil || !ok || sa.Port != int(ap.Port()) {
		t.Errorf("peer %v, %v: want %v", peer, err, ap)
	}
	unix.Close(int(fd))
	if ln6, err := net.Listen("tcp", "[::1]:0"); err == nil { // IPv6, where the host has it
		fd, err := connectLocal(netip.MustParseAddrPort(ln6.Addr().String()))
		if err != nil {
			t.Errorf("connect to a store on [::1]: %v", err)
		} else {
			unix.Close(int(fd))
		}
		ln6.Close()
	}
	ln.Close()
	if fd, err := connectLocal(ap); err == nil {
		unix.Close(int(fd))
		t.Fatal("connect to a closed port succeeded")
	}

	// A listener with a backlog of 1 that never accepts: once its queue is full, the kernel drops
	// further SYNs, and connectLocal must not wait for the retransmission.
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(lfd)
	full := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	var refused int
	for range 8 {
		fd, err := connectLocal(full)
		if err != nil {
			refused++
			continue
		}
		defer unix.Close(int(fd))
	}
	if refused == 0 {
		t.Error("every connect to a full accept queue reported established")
	}
}

// A message that spans reads stays in the loop, which keeps its start and watches its deadline;
// it arrives whole.
func TestLoopPartialMessageStays(t *testing.T) { run(t, testLoopPartialMessageStays, loopsOnly) }

func testLoopPartialMessageStays(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	c := h.dial()
	sent := h.adopted(c)
	set := enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: pattern(100)})
	c.Write(set[:40])
	eventually(t, "the partial message held", func() bool { return h.metric("storeguard_buffered_bytes") != "0" })
	if got := h.store.Received(0); !bytes.Equal(got, sent) {
		t.Fatalf("store received %x of a partial message", got[len(sent):])
	}
	c.Write(set[40:])
	sent = append(sent, set...)
	eventually(t, "the completed SET", func() bool { return bytes.Equal(h.store.Received(0), sent) })
	if v, p := h.loopConns(), h.handbacks("partial"); v != "1" || p != "0" {
		t.Errorf("event_loop_connections %q, handbacks{partial} %q: want the loop to keep the connection", v, p)
	}
}

// A message left incomplete past timeouts.message in a loop is a violation, as on goroutines.
func TestLoopMessageDeadline(t *testing.T) { run(t, testLoopMessageDeadline, loopsOnly) }

func testLoopMessageDeadline(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6"; c.Timeouts.Message = 200 * time.Millisecond })
	c := h.dial()
	sent := h.adopted(c)
	set := enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/k"), Value: pattern(100)})
	began := time.Now()
	c.Write(set[:40])
	closedByPeer(t, c)
	if d := time.Since(began); d < 150*time.Millisecond {
		t.Errorf("closed after %v, before the deadline", d)
	}
	if got := h.store.Received(0); !bytes.Equal(got, sent) {
		t.Fatalf("store received %x of a partial message", got[len(sent):])
	}
	if v := h.metric(`storeguard_violations_total{mode="enforce",rule="message_timeout"}`); v != "1" {
		t.Errorf("message_timeout violations %q", v)
	}
}

// A partial message needing budget that another connection holds: the loop cannot wait, so the
// connection goes back to goroutines, which wait; both messages arrive whole.
func TestLoopBudgetSpentHandsBack(t *testing.T) { run(t, testLoopBudgetSpentHandsBack, loopsOnly) }

func testLoopBudgetSpentHandsBack(t *testing.T, m mode) {
	big := enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/a"), Value: pattern(60 << 10)})
	// The budget holds a maximal message (a's, nearly: a reserves room for its whole value at once)
	// and not b's besides.
	budget := 1024 + 60<<10 + 25
	h := start(t, m, func(c *config.Config) {
		c.Generation = "2.6"
		c.Limits.MaxKeyBytes, c.Limits.MaxValueBytes, c.Limits.MaxMessageBytes = 1024, 60<<10, config.ByteLimit(budget)
		c.Caps.BufferBudgetBytes = int64(budget)
	})
	a := h.dial()
	sentA := h.adopted(a)
	a.Write(big[:len(big)-10])
	eventually(t, "a's partial message holding the budget", func() bool { return h.metric("storeguard_buffered_bytes") == strconv.Itoa(len(big)) })

	b, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	hs := protocol.AppendHandshake(nil, protocol.G3, 6)
	b.Write(hs)
	eventually(t, "b in a loop", func() bool { return h.loopConns() == "2" })
	small := enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet, Key: []byte("/b"), Value: pattern(2000)}) // more than a leaves
	b.Write(small[:30])
	eventually(t, "the hand-back", func() bool { return h.handbacks("partial") == "1" })
	b.Write(small[30:])
	a.Write(big[len(big)-10:])
	eventually(t, "a's message", func() bool { return bytes.Equal(h.store.Received(0), append(sentA, big...)) })
	eventually(t, "b's message", func() bool { return bytes.Equal(h.store.Received(1), append(hs, small...)) })
}

// A client that does not read its replies: the loop keeps what the client could not take and
// hands the connection back; every byte still arrives, in order.
func TestLoopBackpressureToClient(t *testing.T) { run(t, testLoopBackpressureToClient, loopsOnly) }

func testLoopBackpressureToClient(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	reply := pattern(8 << 20)
	c := h.dial()
	h.adopted(c)
	h.store.SetReply(reply)
	c.Write(enc(t, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte("/big")}))
	eventually(t, "the hand-back", func() bool { return h.handbacks("backpressure") == "1" })
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(reply))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, reply) {
		t.Fatal("the client received the reply altered")
	}
}

// A store that stops reading: the loop keeps what the store could not take and hands the
// connection back; every byte still arrives, in order.
func TestLoopBackpressureToStore(t *testing.T) { run(t, testLoopBackpressureToStore, loopsOnly) }

func testLoopBackpressureToStore(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) {
		c.Generation = "2.6"
		c.Timeouts.Message = time.Hour // a deadline the loop keeps for partial messages itself
	})
	h.store.SetReply([]byte{0}) // the client waits for the store's answer to its handshake before it floods
	c := h.dial()
	hs := protocol.AppendHandshake(nil, protocol.G3, 5)
	c.Write(hs)
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	h.store.SetReply(nil)
	h.store.Pause() // from its next read on, the store reads no more
	eventually(t, "a loop forwarding the connection", func() bool { return h.loopConns() == "1" })
	var flood []byte
	for i := 0; len(flood) < 16<<20; i++ {
		flood = append(flood, enc(t, protocol.G3, protocol.Request{Op: protocol.OpSet,
			Key: []byte{'/', byte(i)}, Value: pattern(1000 + i%100)})...)
	}
	go func() { c.Write(flood); c.(*net.TCPConn).CloseWrite() }()
	eventually(t, "the hand-back", func() bool { return h.handbacks("backpressure") == "1" })
	h.store.Resume()
	select {
	case b := <-h.store.Ended:
		if want := append(hs, flood...); !bytes.Equal(b, want) {
			t.Fatalf("store received %d bytes, want the %d sent, unaltered", len(b), len(want))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the store never received the flood")
	}
}

// A violation while a loop forwards: the valid prefix reaches the store, nothing of the bad
// message does, and the client sees a close.
func TestLoopViolationCloses(t *testing.T) { run(t, testLoopViolationCloses, loopsOnly) }

func testLoopViolationCloses(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	c := h.dial()
	sent := h.adopted(c)
	valid := enc(t, protocol.G3, protocol.Request{Op: protocol.OpAdd, Key: []byte("init/"), Int: 1})
	bad := enc(t, protocol.G3, protocol.Request{Op: protocol.OpGet, Key: []byte("/x")})[:9]
	binary.LittleEndian.PutUint64(bad[1:], 0xE0060B0000) // the key length of PyTorch issue #106294
	c.Write(append(append([]byte(nil), valid...), bad...))
	closedByPeer(t, c)
	want := append(sent, valid...)
	eventually(t, "the valid prefix at the store", func() bool { return len(h.store.Received(0)) >= len(want) })
	time.Sleep(50 * time.Millisecond) // anything of the bad message would have arrived by now
	if got := h.store.Received(0); !bytes.Equal(got, want) {
		t.Fatalf("store received %x, want %x", got, want)
	}
	if v := h.metric(`storeguard_violations_total{mode="enforce",rule="key_too_long"}`); v != "1" {
		t.Errorf("violations %q", v)
	}
	eventually(t, "the loop letting the connection go", func() bool { return h.loopConns() == "0" })
}

// A connection a loop forwards from its first byte has no goroutine of its own: idle connections
// cost the loop's bookkeeping and the kernel's sockets, not a goroutine stack each.
func TestLoopConnectionsHaveNoGoroutines(t *testing.T) {
	run(t, testLoopConnectionsHaveNoGoroutines, loopsOnly, serially) // counts the process's goroutines
}

func testLoopConnectionsHaveNoGoroutines(t *testing.T, m mode) {
	h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
	before := runtime.NumGoroutine()
	const n = 200
	for range n {
		h.dial()
	}
	eventually(t, "a loop forwarding every connection", func() bool { return h.loopConns() == strconv.Itoa(n) })
	// The recorder runs a goroutine per connection in this process: subtract those.
	if extra := runtime.NumGoroutine() - before - h.store.NumConns(); extra > n/10 {
		t.Errorf("%d goroutines more for %d connections in loops, want (nearly) none", extra, n)
	}
}

// A loop reports a client's address as Go's accept does, zone included: the per-source caps and
// the audit log see the same source on either accept path.
func TestRawAddrPortMatchesGo(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo interface")
	}
	raw := func(a netip.Addr, port uint16, scope uint32) *unix.RawSockaddrAny {
		var rsa unix.RawSockaddrAny
		if a.Is4() {
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rsa))
			sa.Family, sa.Addr = unix.AF_INET, a.As4()
			*(*[2]byte)(unsafe.Pointer(&sa.Port)) = [2]byte{byte(port >> 8), byte(port)}
		} else {
			sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&rsa))
			sa.Family, sa.Addr, sa.Scope_id = unix.AF_INET6, a.As16(), scope
			*(*[2]byte)(unsafe.Pointer(&sa.Port)) = [2]byte{byte(port >> 8), byte(port)}
		}
		return &rsa
	}
	for _, tc := range []struct {
		rsa  *unix.RawSockaddrAny
		want string
	}{
		{raw(netip.MustParseAddr("10.1.2.3"), 8080, 0), "10.1.2.3:8080"},
		{raw(netip.MustParseAddr("::ffff:10.1.2.3"), 80, 0), "10.1.2.3:80"},
		{raw(netip.MustParseAddr("2001:db8::1"), 29500, 0), "[2001:db8::1]:29500"},
		{raw(netip.MustParseAddr("fe80::1"), 80, uint32(lo.Index)), "[fe80::1%lo]:80"},
		{&unix.RawSockaddrAny{}, "invalid AddrPort"},
	} {
		if got := rawAddrPort(tc.rsa).String(); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.rsa.Addr, got, tc.want)
		}
	}
}

// addrCall's accept4, getsockname and getpeername tell what Go's do, over IPv4 and IPv6.
func TestAddrCallTellsWhatGoDoes(t *testing.T) {
	for _, network := range []string{"127.0.0.1", "[::1]"} {
		ln, err := net.Listen("tcp", network+":0")
		if err != nil {
			t.Logf("%s: %v", network, err)
			continue
		}
		defer ln.Close()
		lf, err := ln.(*net.TCPListener).File() // a duplicate, blocking: the dial is made first
		if err != nil {
			t.Fatal(err)
		}
		defer lf.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fd, src, e := addrCall(unix.SYS_ACCEPT4, int(lf.Fd()), unix.SOCK_CLOEXEC)
		if e != 0 {
			t.Fatalf("%s: accept4: %v", network, e)
		}
		defer unix.Close(fd)
		if want := c.LocalAddr().(*net.TCPAddr).AddrPort(); src != want {
			t.Errorf("%s: accept4 told %v, want the client's %v", network, src, want)
		}
		if _, local, e := addrCall(unix.SYS_GETSOCKNAME, fd, 0); e != 0 || local != ln.Addr().(*net.TCPAddr).AddrPort() {
			t.Errorf("%s: getsockname %v (%v), want %v", network, local, e, ln.Addr())
		}
		if _, peer, e := addrCall(unix.SYS_GETPEERNAME, fd, 0); e != 0 || peer != src {
			t.Errorf("%s: getpeername %v (%v), want %v", network, peer, e, src)
		}
	}
	if _, _, e := addrCall(unix.SYS_GETPEERNAME, -1, 0); e != unix.EBADF {
		t.Errorf("getpeername of no socket: %v, want EBADF", e)
	}
}

// Sockets a loop accepts get Go's options (no Nagle delay, keep-alive after 15 s): from the
// listening socket where the kernel copies them to accepted sockets, set one by one where not.
func TestClientOptionsOfAcceptedSockets(t *testing.T) {
	accept := func(t *testing.T, withOptions bool) int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if withOptions {
			raw, _ := ln.(*net.TCPListener).SyscallConn()
			raw.Control(func(fd uintptr) { setClientOptions(int(fd)) })
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fd, err := dupFd(ln.(*net.TCPListener))
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(int(fd))
		for {
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(nfd) })
			return nfd
		}
	}
	for _, tc := range []struct {
		name        string
		listenerHas bool  // the listening socket has the options
		want        int32 // what clientOptionsOf finds out
	}{
		{"inherited", true, inherits},
		{"set one by one", false, inheritsNot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ls loops
			for range 2 { // the second socket takes the way the first found
				fd := accept(t, tc.listenerHas)
				if !tc.listenerHas && hasClientOptions(fd) {
					t.Fatal("a socket accepted from a plain listener already has the options: the test proves nothing")
				}
				ls.clientOptionsOf(fd)
				if got := ls.inherit.Load(); got != tc.want {
					t.Fatalf("inherit = %d, want %d", got, tc.want)
				}
				if !hasClientOptions(fd) {
					t.Error("the accepted socket lacks the client options")
				}
			}
		})
	}
	t.Run("through the server", func(t *testing.T) {
		run(t, func(t *testing.T, m mode) {
			h := start(t, m, func(c *config.Config) { c.Generation = "2.6" })
			h.dial()
			var fd int32 = -1
			eventually(t, "a loop forwarding the connection", func() bool {
				h.srv.reg.mu.Lock()
				defer h.srv.reg.mu.Unlock()
				for c := range h.srv.reg.conns { // cfd is set before track, and later only under c.mu
					c.mu.Lock()
					fd = c.lt.cfd
					c.mu.Unlock()
				}
				return fd >= 0 && h.loopConns() == "1"
			})
			if !hasClientOptions(int(fd)) {
				t.Error("the client socket a loop accepted lacks the client options")
			}
		}, loopsOnly)
	})
}

// A connection a loop ended after the client's end of stream is garbage at once. The timer that
// bounds the store's last replies (replyGrace) held it for 30 s after its end: a job's start of
// 8,000 ranks left 115 MB of ended connections on the heap, and each later start more. Here the
// grace is 10 minutes, so a held connection would outlast the test's patience whatever the load.
func TestLoopForgetsAnEndedConnection(t *testing.T) {
	run(t, testLoopForgetsAnEndedConnection, loopsOnly)
}

func testLoopForgetsAnEndedConnection(t *testing.T, m mode) {
	store := recorder(t, reservedAddr(t))
	cfg := testConfig(m, store.Addr())
	cfg.Generation = "2.6"
	h := startWithOptions(t, cfg, Options{ReplyGrace: 10 * time.Minute})
	h.store = store
	h.store.SetReply([]byte("ok"))
	c := h.dial()
	h.adopted(c)
	c.SetReadDeadline(time.Now().Add(patience))
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	collected := make(chan struct{})
	h.srv.reg.mu.Lock()
	for cn := range h.srv.reg.conns {
		runtime.SetFinalizer(cn, func(*conn) { close(collected) })
	}
	h.srv.reg.mu.Unlock()
	c.(*net.TCPConn).CloseWrite()
	closedByPeer(t, c)
	eventually(t, "the loop letting the closed connection go", func() bool { return h.loopConns() == "0" })
	eventually(t, "the ended connection collected", func() bool {
		runtime.GC()
		select {
		case <-collected:
			return true
		default:
			return false
		}
	})
}
