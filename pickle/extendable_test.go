package pickle

import "testing"

// TestExtendable: a value that an APPEND could turn into another pickle, read raw or as base64,
// is told from one whose load is settled whatever follows.
func TestExtendable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		want  bool
	}{
		{"half of GLOBAL's module line", "co", true},
		{"GLOBAL, both lines, before its call", "cos\nsystem\n", true},
		// A binary value read as base64 keeps its few alphabet characters ('K', 'c', 'o'): text
		// appended after them could decode, with them, to a pickle.
		{"a complete pickle: raw settled, base64 a quantum under way", "\x80\x04K\x01.", true},
		{"malformed at its first byte: raw settled, base64 under way", "\x02co", true},
		{"settled both ways: raw malformed, base64 of a malformed pickle", "AAAA", false},
		{"settled both ways, split anywhere", "\x02\x02AA\x02AA", false},
		{"a hostname: GLOBAL with no newline yet", "c10-node", true},
		{"empty", "", true},
		// Read raw, base64 of a pickle of protocol 2 or later is GET ('g') with its line under way.
		{"base64 of a complete pickle, padded: raw, a GET line under way", "gARLAS4=", true},
		{"base64, a quantum under way", "gARLAS4uA", true},
		{"base64 of half a pickle", "gARL", true},
		{"torch's rendezvous sentinel (base64 of 'canimadam')", "Y2FuaW1hZGFt", true},
		{"a port number: not base64 yet", "29500", true},
		{"four digits: base64 of a malformed pickle", "2950", false},
	} {
		if got := Extendable([]byte(tc.value), nil, DefaultLimits()); got != tc.want {
			t.Errorf("%s %q: %v, want %v", tc.name, tc.value, got, tc.want)
		}
		for cut := range len(tc.value) {
			if got := Extendable([]byte(tc.value[:cut]), []byte(tc.value[cut:]), DefaultLimits()); got != tc.want {
				t.Errorf("%s %q cut at %d: %v, want %v", tc.name, tc.value, cut, got, tc.want)
			}
		}
	}
}
