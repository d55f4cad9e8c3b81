package audit

import (
	"strings"

	"github.com/storeguard/storeguard/protocol"
)

// ECSVersion is the version of the Elastic Common Schema the events follow; configs/elastic's
// index template and the conformance test (ecs_test.go) are of the same version.
const ECSVersion = "9.4.0"

// Observer says which storeguard wrote the events: the Writer fills observer.* (and host.*, when
// Host is set: the traffic was seen on this host, as serve's is and replay's is not).
type Observer struct {
	Hostname string
	Type     string // "proxy" for serve, "sensor" for replay
	Version  string
	Host     bool
}

// Severity of events, in event.severity (docs/audit-events.md): the higher, the more a person
// should look.
const (
	SeverityInfo     = 1 // a flow that passed, a hand-over, a summary
	SeverityLow      = 3 // refused by policy, a connection that sent nothing or stopped mid-message
	SeverityMedium   = 5 // a hostile message blocked
	SeverityHigh     = 7 // a source banned, a scan detected
	SeverityCritical = 9 // monitor mode: a hostile message reached the store
)

// class is the ECS bookkeeping of one kind of event. outcome is from storeguard's side, as ECS has
// it ("from the perspective of the entity that produced the event"): a probe it blocked or a
// connection it refused is a success, as in ECS's own firewall example; and it is left out where
// there is none to tell (ECS: not for metric events nor for event.type info).
type class struct {
	kind     string
	category []string
	typ      []string
	outcome  string
	severity int
}

var (
	catNetwork = []string{"network"}
	catIDS     = []string{"network", "intrusion_detection"}
)

var classes = map[Action]class{
	ActionBlocked:        {"alert", catIDS, []string{"connection", "denied"}, "success", SeverityMedium},
	ActionWouldBlock:     {"alert", catIDS, []string{"connection", "allowed"}, "success", SeverityCritical},
	ActionDenied:         {"event", catNetwork, []string{"connection", "denied"}, "success", SeverityLow},
	ActionBanned:         {"alert", catIDS, []string{"denied"}, "success", SeverityHigh},
	ActionSampledSummary: {"metric", catNetwork, []string{"info"}, "", SeverityLow},
	ActionDroppedSummary: {"metric", []string{"process"}, []string{"info"}, "", SeverityLow},
	ActionHandover:       {"event", []string{"process"}, []string{"change"}, "success", SeverityInfo},
	ActionFlow:           {"event", catNetwork, []string{"connection", "end"}, "success", SeverityInfo},
	ActionScan:           {"alert", catIDS, []string{"info"}, "", SeverityHigh},
}

var flowInterim = []string{"connection", "info"}

// A refused handshake is a failed authentication as well as a refused connection: ECS's
// authentication category with type start and outcome failure is what a SIEM's failed-logon
// rules look for (a Windows 4625, an sshd "Failed password" are mapped so). Its outcome is the
// authentication's, not storeguard's refusal's.
var (
	catNetworkAuth  = []string{"network", "authentication"}
	typeRefusedAuth = []string{"connection", "denied", "start"}
)

// flowClass is the outcome and severity of a flow by its verdict: failure only when the client's
// stream broke off mid-message or never got past the handshake (half_open: the attempt failed,
// whoever reset it); open is unknown, the connection not being over.
var flowClass = map[Verdict]struct {
	outcome  string
	severity int
}{
	VerdictPassed:     {"success", SeverityInfo},
	VerdictOpen:       {"unknown", SeverityInfo},
	VerdictEmpty:      {"success", SeverityLow},
	VerdictTruncated:  {"failure", SeverityLow},
	VerdictRefused:    {"success", SeverityLow},
	VerdictBlocked:    {"success", SeverityMedium},
	VerdictWouldBlock: {"success", SeverityCritical},
	VerdictIncomplete: {"unknown", SeverityInfo},
	VerdictHalfOpen:   {"failure", SeverityLow},
}

// Classify fills e's ECS bookkeeping from its action, reason and verdict, and o: fields already
// set are kept. The Writer calls it on every event it writes.
func Classify(e *Event, o *Observer) {
	if e.ECS == "" {
		e.ECS = ECSVersion
	}
	if e.Module == "" {
		e.Module, e.Dataset = "storeguard", "storeguard.audit"
	}
	c, known := classes[e.Action]
	if known && e.Kind == "" {
		e.Kind, e.Category, e.Type, e.Outcome, e.Severity = c.kind, c.category, c.typ, c.outcome, c.severity
		switch {
		case e.Action == ActionFlow:
			if e.Verdict == VerdictOpen {
				e.Type = flowInterim
			}
			if fc, ok := flowClass[e.Verdict]; ok {
				e.Outcome, e.Severity = fc.outcome, fc.severity
			}
		case e.Reason == string(protocol.RuleTruncatedMessage):
			e.Severity = SeverityLow
		case e.Action == ActionDenied && IsTLSReason(e.Reason):
			e.Category, e.Type, e.Outcome = catNetworkAuth, typeRefusedAuth, "failure"
		}
	}
	// An incomplete flow's reason is what the capture lacks, not a rule.
	if e.Reason != "" && e.RuleName == "" && e.Action != ActionHandover &&
		!(e.Action == ActionFlow && e.Verdict == VerdictIncomplete) {
		e.RuleName, e.RuleCategory, e.RuleRuleset = e.Reason, ruleCategory(e.Action, e.Reason), "storeguard"
	}
	if (e.SourcePort != 0 || e.DestPort != 0) && e.Transport == "" {
		e.Transport, e.Protocol = "tcp", "tcpstore"
	}
	if o != nil {
		e.ObserverHostname, e.ObserverType, e.ObserverVersion = o.Hostname, o.Type, o.Version
		e.ObserverProduct, e.ObserverVendor = "storeguard", "storeguard"
		if o.Host {
			e.HostHostname, e.HostName = o.Hostname, o.Hostname
		}
	}
}

// ruleCategory: protocol for the decoder's rules, tls for a refused handshake's reason, admission
// for another refusal's, scan.
func ruleCategory(a Action, reason string) string {
	switch {
	case a == ActionScan:
		return "scan"
	case IsTLSReason(reason):
		return "tls"
	case a == ActionDenied, a == ActionFlow && !protocol.IsRule(reason):
		return "admission"
	case strings.HasPrefix(reason, "validate_") || protocol.IsRule(reason):
		return "protocol"
	}
	return "admission"
}
