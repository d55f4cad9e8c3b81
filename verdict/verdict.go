// Package verdict is what follows a verdict, the same in serve and replay: what a violation comes
// to (Of), the verdict of a flow nothing decided (Default), the sources that serve a job (Sources),
// where flow records go (Flows: the flows filter and the scan detector) and how a banned source's
// connection is read (Peek, Peeks). Serve brings the sockets and the wall clock, replay the
// sequence numbers and the capture's time; what they decide is decided here, once. No sockets, no
// clock.
package verdict

import (
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/protocol"
)

// Outcome is what a violation comes to: the action of its audit event and the verdict of its
// connection's flow.
type Outcome struct {
	Action  audit.Action
	Verdict audit.Verdict
}

// Of is what v, a violation of a stream judged in monitor mode or not, comes to. Enforce mode
// blocks it (the guard closes the connection), monitor mode lets it through (would_block). A
// message the stream's end cut short is blocked in either mode: none of it was forwarded.
func Of(v *protocol.Violation, monitor bool) Outcome {
	switch {
	case v.Rule == protocol.RuleTruncatedMessage:
		return Outcome{audit.ActionBlocked, audit.VerdictTruncated}
	case monitor:
		return Outcome{audit.ActionWouldBlock, audit.VerdictWouldBlock}
	}
	return Outcome{audit.ActionBlocked, audit.VerdictBlocked}
}

// Closes reports whether the guard closes the connection at the violation (enforce mode). A
// message cut short ended with its stream; in monitor mode the stream goes on.
func (o Outcome) Closes() bool { return o.Verdict == audit.VerdictBlocked }

// Bans reports whether the violation is a step towards a ban of its source: one the guard closed
// the connection for. A message cut short never is: the client's end cut it, not the guard.
func (o Outcome) Bans() bool { return o.Closes() }

// Default is the verdict of a flow that ended with nothing decided (no violation, no refusal, no
// rule broken in monitor mode): empty when its client sent nothing, else passed.
func Default(fromClient uint64) audit.Verdict {
	if fromClient == 0 {
		return audit.VerdictEmpty
	}
	return audit.VerdictPassed
}
