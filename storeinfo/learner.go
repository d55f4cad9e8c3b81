package storeinfo

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

// Target is the store the guard forwards to, as its settings say now.
type Target struct {
	Addr string
	Auto bool                // generation auto: the store's is learned
	Gen  protocol.Generation // the generation configured, unless Auto
}

// Observer is told what a Learner finds, on the goroutine that found it. live is false once that
// learning was stopped (a reload started it anew, or its context ended): what it found is stale.
type Observer interface {
	// Failed: a probe got no answer (the store is not up, slow or busy); it is asked again.
	Failed(addr string, err error, live bool)
	// Learned: the store speaks info, known from now on.
	Learned(addr string, info Info, live bool)
	// Gone: the store closed the guard's idle connection (a restart?), while learning was live;
	// info is forgotten, and learned again.
	Gone(addr string, info Info, err error)
	// Forgot: learning starts anew, for the settings of the moment; nothing is known.
	Forgot()
	// KeyLookup: the store was asked whether a key exists: "exists", "absent" or "error".
	KeyLookup(result string)
}

// Learner keeps, in auto mode, the generation the store speaks, learned from it; a reload that
// changes the upstream or switches to auto starts learning anew (Restart). It also asks the store
// about its keys (Exists, Count).
type Learner struct {
	target func() Target
	obs    Observer
	now    func() time.Time
	state  atomic.Pointer[state]
	keys   keyOracle

	mu     sync.Mutex
	ctx    context.Context // Start's, once it ran
	cancel context.CancelFunc
}

// NewLearner learns about the store target names (read anew at each question and each Restart),
// telling obs; nothing is known and nothing is learned until Start.
func NewLearner(target func() Target, obs Observer, now func() time.Time) *Learner {
	l := &Learner{target: target, obs: obs, now: now}
	l.keys.l = l
	l.state.Store(newState())
	return l
}

// state is the generation of the store behind the guard in auto mode: unknown until learned,
// and unknown again from the moment the store is seen to go away (a restart may bring another
// torch). Connections that arrive while it is unknown wait for it.
type state struct {
	mu    sync.Mutex
	info  Info
	known bool
	ready chan struct{} // closed while known; a new one replaces it when the store goes away
}

func newState() *state { return &state{ready: make(chan struct{})} }

func (s *state) get() (Info, bool, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info, s.known, s.ready
}

func (s *state) set(i Info) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.info, s.known = i, true
	close(s.ready)
}

func (s *state) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known {
		s.known, s.ready = false, make(chan struct{})
	}
}

// Get reports the generation and backend of the store as learned in auto mode; ok is false
// while it is not known (and always with a generation configured).
func (l *Learner) Get() (info Info, ok bool) {
	info, ok, _ = l.state.Load().get()
	return info, ok
}

// Await returns the store's generation once known, or false after timeout or when stop closes.
func (l *Learner) Await(timeout time.Duration, stop <-chan struct{}) (Info, bool) {
	s := l.state.Load()
	info, known, ready := s.get()
	if known {
		return info, true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		info, known, _ = s.get()
		return info, known
	case <-t.C:
	case <-stop:
	}
	return Info{}, false
}

// Adopt takes info as known: what the process before this one learned (an upgrade in place).
func (l *Learner) Adopt(info Info) { l.state.Load().set(info) }

// Start starts learning, under ctx, and again at each Restart after it.
func (l *Learner) Start(ctx context.Context) {
	l.mu.Lock()
	l.ctx = ctx
	l.mu.Unlock()
	l.Restart()
}

// Context is Start's context, or nil before it.
func (l *Learner) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctx
}

// Restart starts learning the store's generation anew for the current target (auto mode): at
// Start, and on a reload that switches to auto or changes the upstream. What was known of the old
// upstream is dropped; with a generation configured nothing is learned.
func (l *Learner) Restart() {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The target as it is now, read under mu: a reload racing Start (Start's caller holding older
	// settings, the reload finding no ctx yet) still starts learning.
	t := l.target()
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	st := newState()
	l.state.Store(st)
	l.obs.Forgot()
	if t.Auto && l.ctx != nil {
		ctx, cancel := context.WithCancel(l.ctx)
		l.cancel = cancel
		go l.learn(ctx, st, t.Addr)
	}
}

// learn keeps the store's generation known while ctx lives: it asks the store (retrying a store
// that is not up, slow or busy, every 50 ms to 1 s) and, while the answer holds, keeps one idle
// connection to it, a sentinel, whose close says the store went away; then it forgets and asks
// again.
func (l *Learner) learn(ctx context.Context, st *state, addr string) {
	const probeTimeout = 3 * time.Second
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		sentinel, info, err := learnOnce(ctx, addr, probeTimeout)
		if err != nil {
			l.obs.Failed(addr, err, ctx.Err() == nil)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		st.set(info)
		l.obs.Learned(addr, info, ctx.Err() == nil)
		stop := context.AfterFunc(ctx, func() { sentinel.Close() })
		var b [1]byte
		_, err = sentinel.Read(b[:]) // blocks while the store lives
		stop()
		sentinel.Close()
		st.forget()
		if ctx.Err() == nil {
			l.obs.Gone(addr, info, err)
		}
	}
}

// learnOnce connects the sentinel, then asks the store (Learn). The sentinel comes first, so
// that a store that goes away at any moment after the answer's first byte has closed it. It
// sends nothing: an idle connection costs no store anything, and nothing sent can be misread.
func learnOnce(ctx context.Context, addr string, timeout time.Duration) (net.Conn, Info, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	sentinel, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, Info{}, err
	}
	info, err := Learn(ctx, addr, timeout)
	if err != nil {
		sentinel.Close()
		return nil, Info{}, err
	}
	return sentinel, info, nil
}
