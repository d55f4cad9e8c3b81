package probename

import (
	"bytes"
	"testing"
)

// FuzzName: Name never panics, looks at no more than MaxPrefix bytes, gives snake-case names, and
// names nothing a torch client can begin a connection with. Seeds: every capture, the real torch
// streams, and testdata/fuzz/FuzzName.
func FuzzName(f *testing.F) {
	for _, v := range loadObserved(f) {
		f.Add(v.bytes)
	}
	for _, s := range torchStreams(f) {
		f.Add(s.bytes[:min(len(s.bytes), 2*MaxPrefix)])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		name := Name(b)
		if len(b) > MaxPrefix {
			head := bytes.Clone(b[:MaxPrefix])
			if got := Name(head); got != name {
				t.Fatalf("Name looks past MaxPrefix: %q for %x, %q for its first %d bytes", name, b, got, MaxPrefix)
			}
			if got := Name(append(head, ^b[MaxPrefix])); got != name {
				t.Fatalf("Name looks past MaxPrefix: a different byte %d gives %q, not %q", MaxPrefix, got, name)
			}
		}
		if name == "" {
			return
		}
		if !nameSyntax.MatchString(name) {
			t.Fatalf("%q is not lower snake case", name)
		}
		if !Known(name) {
			t.Fatalf("Name gives %q, which Known does not know", name)
		}
		if err := notTorch(b[:min(len(b), MaxPrefix)]); err != nil {
			t.Fatalf("named %q: %v", name, err)
		}
	})
}
