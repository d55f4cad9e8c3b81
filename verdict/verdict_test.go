package verdict

import (
	"testing"

	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rule    protocol.Rule
		monitor bool
		want    Outcome
		bans    bool
	}{
		{"enforce", protocol.RuleMessageTooLarge, false, Outcome{audit.ActionBlocked, audit.VerdictBlocked}, true},
		{"monitor", protocol.RuleMessageTooLarge, true, Outcome{audit.ActionWouldBlock, audit.VerdictWouldBlock}, false},
		// cut short: blocked in either mode (nothing of it was forwarded), never a step towards a ban
		{"truncated, enforce", protocol.RuleTruncatedMessage, false, Outcome{audit.ActionBlocked, audit.VerdictTruncated}, false},
		{"truncated, monitor", protocol.RuleTruncatedMessage, true, Outcome{audit.ActionBlocked, audit.VerdictTruncated}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Of(&protocol.Violation{Rule: tc.rule}, tc.monitor)
			if o != tc.want || o.Bans() != tc.bans || o.Closes() != tc.bans {
				t.Errorf("Of = %+v, bans %v, closes %v; want %+v, bans %v", o, o.Bans(), o.Closes(), tc.want, tc.bans)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	if v := Default(0); v != audit.VerdictEmpty {
		t.Errorf("nothing sent: %s", v)
	}
	if v := Default(1); v != audit.VerdictPassed {
		t.Errorf("one byte sent: %s", v)
	}
}
