package idpattern

import (
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{"spiffe://job.example/ns/train/sa/worker",
			[]string{"spiffe://job.example/ns/train/sa/worker", "uri:spiffe://job.example/ns/train/sa/worker"},
			[]string{"spiffe://job.example/ns/train/sa/worker/x", "spiffe://job.example/ns/train/sa/Worker",
				"spiffe://other.example/ns/train/sa/worker", "dns:job.example", "cn:spiffe://job.example/ns/train/sa/worker", ""}},
		{"spiffe://job.example/ns/*/sa/worker",
			[]string{"spiffe://job.example/ns/train/sa/worker", "spiffe://job.example/ns//sa/worker"},
			[]string{"spiffe://job.example/ns/a/b/sa/worker", "spiffe://job.example/ns/train/sa/worker2"}},
		{"spiffe://job.example/ns/train/**",
			[]string{"spiffe://job.example/ns/train", "spiffe://job.example/ns/train/sa/worker", "spiffe://job.example/ns/train/a/b/c/d"},
			[]string{"spiffe://job.example/ns/training/sa/w", "spiffe://job.example/ns"}},
		{"spiffe://job.example/**/worker",
			[]string{"spiffe://job.example/worker", "spiffe://job.example/ns/a/sa/worker"},
			[]string{"spiffe://job.example/ns/a/sa/worker/x"}},
		{"spiffe://job.example/ns/w-*",
			[]string{"spiffe://job.example/ns/w-0", "spiffe://job.example/ns/w-"},
			[]string{"spiffe://job.example/ns/x-0", "spiffe://job.example/ns/w-0/x"}},
		{"uri:https://ids.example/**",
			[]string{"uri:https://ids.example/a/b", "uri:https://ids.example"},
			[]string{"spiffe://ids.example/a", "uri:http://ids.example/a"}},
		{"uri:spiffe://job.example/**",
			[]string{"spiffe://job.example/x"}, []string{"spiffe://evil.example/x"}},
		{"dns:*.job.example",
			[]string{"dns:w0.job.example", "dns:W0.JOB.example"},
			[]string{"dns:a.w0.job.example", "dns:job.example", "cn:w0.job.example", "spiffe://w0.job.example"}},
		{"dns:**.job.example",
			[]string{"dns:job.example", "dns:a.b.job.example"}, []string{"dns:job.example.evil"}},
		{"DNS:x", nil, nil}, // not a pattern (parsed below)
		{"cn:worker-*",
			[]string{"cn:worker-0", "cn:worker-a/b.c"}, []string{"cn:Worker-0", "dns:worker-0"}},
		{"cn:*", []string{"cn:anything", "cn:"}, []string{"dns:a"}},
	}
	for _, tt := range tests {
		p, err := Parse(tt.pattern)
		if tt.yes == nil && tt.no == nil {
			if err == nil {
				t.Errorf("Parse(%q) accepted it", tt.pattern)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.pattern, err)
		}
		for _, id := range tt.yes {
			if !p.Match(id) {
				t.Errorf("%q does not match %q", tt.pattern, id)
			}
		}
		for _, id := range tt.no {
			if p.Match(id) {
				t.Errorf("%q matches %q", tt.pattern, id)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	for pattern, want := range map[string]string{
		"":                         "empty pattern",
		"worker":                   "not spiffe://, uri:, dns: or cn:",
		"spiffe://":                "no trust domain",
		"spiffe:///ns/x":           "no trust domain",
		"dns:":                     "nothing after the prefix",
		"spiffe://td/ns/a**":       "** stands for whole segments",
		"dns:***.x":                "** stands for whole segments",
		"spiffe://td/ns/x y":       "a space or a control character at byte 16",
		"cn:a\x00":                 "control character",
		"dns:" + deep(maxSegments): "more than 256 segments",
	} {
		_, err := Parse(pattern)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", pattern, err, want)
		}
	}
	if _, err := ParseSet([]string{"dns:a", "nope"}); err == nil || !strings.HasPrefix(err.Error(), "[1] ") {
		t.Errorf("ParseSet error %v, want it to name [1]", err)
	}
}

func deep(n int) string { return strings.Repeat("a.", n) + "a" }

func TestSet(t *testing.T) {
	s, err := ParseSet([]string{"spiffe://td/ns/a/**", "dns:*.b"})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"spiffe://td/ns/a/x": true, "dns:x.b": true, "dns:x.c": false, "": false} {
		if s.Match(id) != want {
			t.Errorf("Set.Match(%q) = %v, want %v", id, !want, want)
		}
	}
	if got := strings.Join(s.Strings(), " "); got != "spiffe://td/ns/a/** dns:*.b" {
		t.Errorf("Strings = %q", got)
	}
	if (Set(nil)).Match("dns:x") || (Pattern{}).Match("dns:x") {
		t.Error("an empty set or a zero pattern matched")
	}
}

// FuzzMatch: any pattern Parse takes and any identity are matched without a panic, in bounded
// time, and a pattern with no wildcard matches the identity it spells.
func FuzzMatch(f *testing.F) {
	for _, s := range [][2]string{
		{"spiffe://td/ns/*/sa/worker", "spiffe://td/ns/x/sa/worker"},
		{"spiffe://td/**/**/**/x", "spiffe://td/a/b/c/d/e/f/g/h/y"},
		{"dns:**.*.*.x", "dns:a.b.c.d.x"},
		{"uri:https://h/**", "uri:https://h/a"},
		{"cn:*a*a*a*a*b", "cn:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, id string) {
		p, err := Parse(pattern)
		if err != nil {
			return
		}
		p.Match(id)
		if !strings.Contains(pattern, "*") {
			self := pattern
			if strings.HasPrefix(pattern, "dns:") {
				self = strings.ToLower(pattern)
			}
			if !p.Match(self) && !strings.HasPrefix(pattern, "uri:") {
				t.Fatalf("%q does not match itself", pattern)
			}
		}
	})
}
