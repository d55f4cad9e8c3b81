package policy

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/storeguard/storeguard/protocol"
)

// fakeStore holds values as a store would, for the policy to ask (Value); what a passed message
// writes lands only when the test says so (land), as a write on its way would.
type fakeStore map[string][]byte

func (f fakeStore) value(key []byte, limit int) ([]byte, bool, error) {
	v, ok := f[string(key)]
	return append([]byte(nil), v...), ok, nil
}

// splitPolicy is the default policy with a store to ask and the split rule's memory.
func splitPolicy(t *testing.T, store fakeStore) *Policy {
	t.Helper()
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	s := Store{Written: NewWritten(64), Appends: NewAppends(64)}
	if store != nil {
		s.Value = store.value
	}
	return p.WithStore(s)
}

func checkOn(t *testing.T, p *Policy, stream uint64, r protocol.Request) (Finding, bool) {
	t.Helper()
	msg, b := message(t, r)
	return p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Stream: stream}, nil)
}

func appendReq(key, value string) protocol.Request {
	return protocol.Request{Op: protocol.OpAppend, Key: []byte(key), Value: []byte(value)}
}

// evilSplit is the os.system pickle (protocol 0) cut after its second byte: b"co", then the rest,
// each malformed alone, so neither imports anything.
func evilSplit(t *testing.T) (head, tail string) {
	evil := string(unhex(t, evil0))
	return evil[:2], evil[2:]
}

// TestAppendSplitsRefused: a refused pickle sent in pieces by APPEND is refused, whichever way it
// is cut and sent: from one connection with the first piece not yet in the store or already
// there, from two connections in either state, after a SET of the first piece, as base64, and a
// SET that would complete an APPEND's piece.
func TestAppendSplitsRefused(t *testing.T) {
	head, tail := evilSplit(t)
	evil := string(unhex(t, evil0))
	b64 := base64.StdEncoding.EncodeToString(unhex(t, evil4))
	for _, tc := range []struct {
		name   string
		steps  []protocol.Request
		stream []uint64
		land   []bool // the step's write reaches the store before the next is judged
		rule   protocol.Rule
	}{
		{"two appends, one connection, the first on its way", []protocol.Request{appendReq("/k", head), appendReq("/k", tail)},
			[]uint64{1, 1}, []bool{false, false}, protocol.RulePickleGlobalDenied},
		{"two appends, one connection, the first landed", []protocol.Request{appendReq("/k", head), appendReq("/k", tail)},
			[]uint64{1, 1}, []bool{true, false}, protocol.RulePickleGlobalDenied},
		{"two appends, two connections, the first on its way", []protocol.Request{appendReq("/k", head), appendReq("/k", tail)},
			[]uint64{1, 2}, []bool{false, false}, protocol.RuleValueSplit},
		{"two appends, two connections, the first landed", []protocol.Request{appendReq("/k", head), appendReq("/k", tail)},
			[]uint64{1, 2}, []bool{true, false}, protocol.RulePickleGlobalDenied},
		{"the tail first, then the head, two connections", []protocol.Request{appendReq("/k", tail), appendReq("/k", head)},
			[]uint64{1, 2}, []bool{false, false}, protocol.RuleValueSplit},
		{"one byte at a time", bytesOf(evil), nil, nil, protocol.RulePickleGlobalDenied},
		{"a SET of the head, then an append of the tail", []protocol.Request{setReq("/k", head), appendReq("/k", tail)},
			[]uint64{1, 2}, []bool{true, false}, protocol.RuleValueSplit},
		{"base64, in two appends", []protocol.Request{appendReq("/k", b64[:10]), appendReq("/k", b64[10:])},
			[]uint64{1, 1}, []bool{true, false}, protocol.RulePickleGlobalDenied},
		{"a refused pickle appended whole", []protocol.Request{appendReq("/k", evil)}, nil, nil, protocol.RulePickleGlobalDenied},
		{"by QUEUE_PUSH: each item is popped whole", []protocol.Request{{Op: protocol.OpQueuePush, Key: []byte("/q"), Value: []byte(evil)}},
			nil, nil, protocol.RulePickleGlobalDenied},
		{"by MULTI_SET, beside a harmless pair", []protocol.Request{{Op: protocol.OpMultiSet, Keys: [][]byte{[]byte("/a"), []byte("/k")},
			Values: [][]byte{[]byte("x"), []byte(evil)}}}, nil, nil, protocol.RulePickleGlobalDenied},
		{"by COMPARE_SET's desired value", []protocol.Request{{Op: protocol.OpCompareSet, Key: []byte("/k"), Value: []byte(""),
			Desired: []byte(evil)}}, nil, nil, protocol.RulePickleGlobalDenied},
		{"the head past the guard, the tail by APPEND", []protocol.Request{appendReq("/k", tail)},
			nil, nil, protocol.RulePickleGlobalDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := fakeStore{}
			if strings.HasPrefix(tc.name, "the head past the guard") {
				store["/k"] = []byte(head) // written by a rank on the store's host, past the guard
			}
			p := splitPolicy(t, store)
			var f Finding
			broke := false
			for i, r := range tc.steps {
				stream, land := uint64(1), true
				if tc.stream != nil {
					stream, land = tc.stream[i], tc.land[i]
				}
				if f, broke = checkOn(t, p, stream, r); broke {
					if i == 0 && len(tc.steps) > 1 {
						t.Fatalf("the first piece refused: %s %q", f.Rule, f.Detail)
					}
					break // refused before the value is whole: what the reader loads never imports
				}
				if land {
					applyTo(store, r)
				}
			}
			if !broke || f.Rule != tc.rule {
				t.Fatalf("%v %s %q, want %s", broke, f.Rule, f.Detail, tc.rule)
			}
		})
	}
}

// TestAppendsTorchsAPIUses pass: what interop/workload.py does with the APPEND of every release
// (b"a", then b"bc", one connection), appends of text from two connections one after the other,
// and an append to a key holding a settled pickle (nothing appended changes what loads).
func TestAppendsTorchsAPIUses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		steps  []protocol.Request
		stream []uint64
		land   []bool
	}{
		{"a, then bc, on their way", []protocol.Request{appendReq("/ap", "a"), appendReq("/ap", "bc")}, []uint64{1, 1}, []bool{false, false}},
		{"a, then bc, landed", []protocol.Request{appendReq("/ap", "a"), appendReq("/ap", "bc")}, []uint64{1, 1}, []bool{true, true}},
		{"log lines from two connections", []protocol.Request{appendReq("/log", "rank 0 ready\n"), appendReq("/log", "rank 1 ready\n")},
			[]uint64{1, 2}, []bool{true, true}},
		{"after a settled pickle", []protocol.Request{appendReq("/p", "\x80\x04K\x01."), appendReq("/p", "(S'x'\n")},
			[]uint64{1, 2}, []bool{true, true}},
		// An intruder APPENDs to a key first; the job's own write of it (an unsettled value: a host name
		// reads as GLOBAL with its line under way) passes, as it would without the guard.
		{"the job's SET after an intruder's APPEND", []protocol.Request{appendReq("/job/host/0", "\x80\x02"),
			setReq("/job/host/0", "c10-node-0")}, []uint64{1, 2}, []bool{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := fakeStore{}
			p := splitPolicy(t, store)
			for i, r := range tc.steps {
				if f, broke := checkOn(t, p, tc.stream[i], r); broke {
					t.Fatalf("step %d: %s %q", i, f.Rule, f.Detail)
				}
				if tc.land[i] {
					applyTo(store, r)
				}
			}
		})
	}
}

func bytesOf(s string) []protocol.Request {
	var rs []protocol.Request
	for i := range len(s) {
		rs = append(rs, appendReq("/k", s[i:i+1]))
	}
	return rs
}

func applyTo(store fakeStore, r protocol.Request) {
	switch r.Op {
	case protocol.OpAppend:
		store[string(r.Key)] = append(store[string(r.Key)], r.Value...)
	case protocol.OpSet:
		store[string(r.Key)] = append([]byte(nil), r.Value...)
	}
}

// TestAppendWithoutAStore: replay has no store to ask; one stream's appends are judged together.
func TestAppendWithoutAStore(t *testing.T) {
	head, tail := evilSplit(t)
	p := splitPolicy(t, nil)
	if _, broke := checkOn(t, p, 7, appendReq("/k", head)); broke {
		t.Fatal("the head alone refused")
	}
	f, broke := checkOn(t, p, 7, appendReq("/k", tail))
	if !broke || !strings.Contains(f.Detail, "imports posix.system") {
		t.Fatalf("%v %q", broke, f.Detail)
	}
}

// A SET of a pickle's first bytes judged after another connection's APPEND of the rest passed,
// both on their way (the store may land the SET first, then the APPEND): the SET is judged with
// the APPEND's bytes after it, and refused. Judged the other way round, the os.system pickle ran in
// a reader (interop test_append_splits_run_nothing_in_a_reader, set_then_append, 1 run in 6). A
// job's complete value written after an intruder's APPEND still passes: the reader stops at STOP.
func TestWholeWriteAfterAnAppendOnItsWay(t *testing.T) {
	head, tail := evilSplit(t)
	store := fakeStore{}
	p := splitPolicy(t, store)
	if f, broke := checkOn(t, p, 2, appendReq("/k", tail)); broke {
		t.Fatalf("the tail alone: %s %q", f.Rule, f.Detail)
	}
	if f, broke := checkOn(t, p, 1, setReq("/k", head)); !broke || f.Rule != protocol.RulePickleGlobalDenied {
		t.Fatalf("the head by SET after the tail's APPEND: %v %s %q", broke, f.Rule, f.Detail)
	}
	benign := string(unhex(t, "80049505000000000000004b012e")) // pickle.dumps(1), protocol 4
	if f, broke := checkOn(t, p, 2, appendReq("/j", tail)); broke {
		t.Fatalf("an intruder's APPEND: %s %q", f.Rule, f.Detail)
	}
	if f, broke := checkOn(t, p, 1, setReq("/j", benign)); broke {
		t.Fatalf("the job's complete value after an intruder's APPEND: %s %q", f.Rule, f.Detail)
	}
	if f, broke := checkOn(t, p, 1, setReq("/j2", "10.0.0.1")); broke {
		t.Fatalf("a plain value: %s %q", f.Rule, f.Detail)
	}
}

// A whole write judged while an APPEND asks the store for the key's value: neither saw the other
// (the APPEND's bytes not yet recorded, the key not yet written whole when it looked), and both
// passed; in a real store the SET of the pickle's head could land first, the APPEND's tail after
// it. The APPEND is refused now: it looks again as it records.
func TestWholeWriteWhileAnAppendIsJudged(t *testing.T) {
	head, tail := evilSplit(t)
	p, err := New(Defaults())
	if err != nil {
		t.Fatal(err)
	}
	var p2 *Policy
	asked, setPassed := false, false
	value := func(key []byte, limit int) ([]byte, bool, error) {
		if !asked {
			asked = true
			_, broke := checkOn(t, p2, 1, setReq("/k", head))
			setPassed = !broke
		}
		return nil, false, nil
	}
	p2 = p.WithStore(Store{Written: NewWritten(64), Appends: NewAppends(64), Value: value})
	f, broke := checkOn(t, p2, 2, appendReq("/k", tail))
	if !setPassed {
		t.Fatal("the SET judged meanwhile was refused: the race was not made")
	}
	if !broke || f.Rule != protocol.RuleValueSplit {
		t.Fatalf("the APPEND judged while the SET passed: %v %s %q", broke, f.Rule, f.Detail)
	}
}
