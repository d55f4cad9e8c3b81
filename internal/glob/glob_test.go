package glob

import "testing"

func TestMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s  string
		match, star bool
	}{
		{"", "", true, true},
		{"", "a", false, false},
		{"*", "", true, true},
		{"*", "anything/at/all", true, true},
		{"torch.rendezvous.*/MASTER_ADDR", "torch.rendezvous.job.0/MASTER_ADDR", true, true},
		{"torch.rendezvous.*/MASTER_ADDR", "torch.rendezvous.job.0/MASTER_PORT", false, false},
		{"a*b*c", "aXbYbZc", true, true},
		{"a*b*c", "aXbYbZ", false, false},
		{"*a", "aaaa", true, true},
		{"a?c", "abc", true, false},
		{"a?c", "a?c", true, true},
		{"a?c", "ac", false, false},
		{"**", "x", true, true},
		{"a*", "*a", false, false}, // a * of s is a byte like any other
		{"*x*", "a*b", false, false},
		// A * of the pattern once matched a * of the key as a literal byte and then failed the rest:
		// "secret/*" did not match "secret/*x", and a deny rule let a key with a * past.
		{"*", "*x", true, true}, {"secret/*", "secret/*x", true, true}, {"a*b", "a*b*b", true, true},
		{"a*", "a*1*?2", true, true}, {"*?", "*", true, false}, {"a*b", "a*c", false, false},
		{"a?c", "a*c", true, false}, {"a", "a*", false, false},
	} {
		if got := Match(c.pattern, c.s); got != c.match {
			t.Errorf("Match(%q, %q) = %v", c.pattern, c.s, got)
		}
		if got := Match([]byte(c.pattern), []byte(c.s)); got != c.match {
			t.Errorf("Match([]byte %q, %q) = %v", c.pattern, c.s, got)
		}
		if got := Star(c.pattern, c.s); got != c.star {
			t.Errorf("Star(%q, %q) = %v", c.pattern, c.s, got)
		}
	}
}

func TestNoAllocation(t *testing.T) {
	p, s := []byte("torch.rendezvous.*/torchelastic/assigned_ranks/*"), []byte("torch.rendezvous.job.0/torchelastic/assigned_ranks/17")
	if n := testing.AllocsPerRun(100, func() { Match(p, s) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
}
