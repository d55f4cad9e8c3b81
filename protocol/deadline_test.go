package protocol

import (
	"testing"
	"time"
)

func TestDeadlines(t *testing.T) {
	start := time.Unix(1000, 0)
	msgStart := start.Add(5 * time.Second)
	dl := Deadlines{Message: 30 * time.Second, FirstMessage: 10 * time.Second}

	silent := NewDecoder(exact(G0))
	if got := dl.Next(silent, start, msgStart, false); !got.Equal(start.Add(10 * time.Second)) {
		t.Errorf("silent stream: %v", got)
	}
	if got := dl.Next(silent, start, msgStart, true); !got.IsZero() {
		t.Errorf("waived first-message deadline: %v", got)
	}
	if v := dl.Expire(silent); v.Rule != RuleFirstMessageTimeout {
		t.Errorf("silent stream expires as %s", v.Rule)
	}

	partial := decoderAfter(exact(G0), unhex(t, "06 00 0300000000000000 2f"))
	if got := dl.Next(partial, start, msgStart, false); !got.Equal(msgStart.Add(30 * time.Second)) {
		t.Errorf("message in progress: %v", got)
	}
	if v := dl.Expire(partial); v.Rule != RuleMessageTimeout || v.Offset != 1 {
		t.Errorf("partial message expires as %s at %d", v.Rule, v.Offset)
	}

	between := decoderAfter(exact(G0), unhex(t, "06"))
	if got := dl.Next(between, start, msgStart, false); !got.IsZero() {
		t.Errorf("between messages: %v (no idle deadline here)", got)
	}
	if got := (Deadlines{}).Next(partial, start, msgStart, false); !got.IsZero() {
		t.Errorf("deadlines off: %v", got)
	}

	for _, c := range []struct {
		g       GenSetting
		working bool
		want    bool
	}{
		{GenSetting{Gen: G0}, true, true}, {GenSetting{Auto: true}, true, true},
		{GenSetting{Gen: G0}, false, false}, {GenSetting{Gen: G1}, true, false}, {GenSetting{Gen: G3}, true, false},
	} {
		if got := MaySpareSilent(c.g, c.working); got != c.want {
			t.Errorf("MaySpareSilent(%s, %v) = %v", c.g, c.working, got)
		}
	}
}
