// Package replay runs serve's guard over recorded traffic: pcap or pcapng files (gzip too) are
// reassembled into TCP streams with gopacket, and every client-to-server stream to a TCPStore port
// goes through the same protocol.Decoder, limits and message deadlines as a live connection.
//
// What replay can and cannot tell:
//   - Only the client-to-server direction is decoded. The store's side is counted (bytes, by
//     sequence number), never decoded, and its FIN or RST ends the stream as it ends serve's
//     connection: serve closes the client when the store closes, so no later byte is judged.
//   - A stream that ends (the client's or the store's FIN or RST) inside a message is
//     truncated_message at the message's start: none of it reached the store. It is a blocked
//     event in either mode, as serve records it; a stream the capture ends while a message is in
//     progress is not (it lasts).
//   - A stream whose SYN is not in the capture is reported incomplete (midstream): where its
//     messages begin cannot be known, and replay does not guess.
//   - A stream whose handshake never completes (the client's RST after the SYN-ACK, as nmap's SYN
//     scan sends; the store's RST, a closed port; or no ACK before it goes idle or the capture
//     ends) is half_open: serve, in user space, never sees it, as accept never returns it. It is
//     not admitted, holds no connection slot and gets no admission event; its flow record
//     (verdict half_open, closed by whoever reset it) counts towards a scan.
//   - Bytes missing from the capture (a lost segment, a segment cut by the snap length, an IP
//     fragment) stop decoding there: incomplete (gap), unless a violation came first.
//   - Deadlines run on capture time. A message in progress that gets no completing bytes within
//     timeouts.message is message_timeout, as serve would have judged it live; at a close or at
//     the end of the capture only if the capture went on past the deadline. A stream that sends
//     nothing is never a violation by itself; timeouts.first-message applies only when set, with
//     serve's allowance for G0's silent second connection. timeouts.idle is not applied: serve
//     closes an idle connection without a violation, and replay keeps judging what follows.
//   - With generation auto, a stream that does not begin with VALIDATE is read as G0: serve asks
//     the store whether it speaks G0 or G1, which a capture cannot. Pass --generation 2.1 (G1)
//     for torch 2.1 clients.
//   - Admission is serve's too: an admission.Gate on capture time, one per capture, with the
//     configuration's access lists, caps and bans, is asked for each stream where serve's accept
//     would return it, at the client's first segment after its SYN that carries ACK (the
//     handshake's last, or data; the store's SYN-ACK need not be in the capture), and told of each
//     violation (enforce mode, not truncated_message); a banned source with another stream open
//     that completed a valid message is throttled (ban.serving-rate), as serve throttles it. Serve
//     closes a silent connection to admit a new one at caps.max-connections; replay does not: it
//     refuses the new one (max_connections). A stream it refuses is not decoded: verdict refused, with
//     the reason, a denied event at its accept and a refused flow closed by the guard. One refused
//     as banned (or ban_throttled) is read as serve reads it for ban.peek: its first bytes (at most
//     admission.PeekBytes, until admission.PeekRest after the first came, ban.peek after the
//     accept, or its end) go in the flow record, judged by a decoder of their own; any other ends
//     at its accept with none. The ban itself is a banned event after the violation that started
//     it. Message deadlines, as serve's, run from the accept. Caps count a stream from its accept
//     to its flow's end: a capture that lost a FIN holds the slot
//     until the stream goes idle, as no live connection would. Streams without a SYN in the
//     capture were admitted before it.
//
// With an audit file, each stream also gets the flow record serve writes per connection
// (audit.Flow, as config flows selects them), at the stream's end: its client's or store's FIN
// or RST, the violation where serve would have closed it (enforce mode), or, for a stream still
// open when the capture ends, the capture's last packet, with verdict open. Its bytes forwarded
// are what serve would have forwarded: the whole valid messages before a violation, everything in
// monitor mode. Every ended flow goes to a scan detector (scan.*), whose notice is written at once.
//
// Each file is a capture of its own: streams do not continue from one file into the next (merge
// rotated parts with mergecap -a first).
package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/audit"
	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/guard"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/verdict"
)

// Options tune a replay. The zero value uses cfg's ports and the defaults below.
type Options struct {
	// Ports are the TCPStore server ports; a TCP segment to one of them is client-to-server.
	// Empty means cfg.Replay.Ports.
	Ports []uint16
	// AuditFile receives the audit events serve would have written (mode replay), with capture
	// timestamps, rotated and sampled per cfg.Audit. "" writes none.
	AuditFile string
	// Observer names the replaying storeguard in the audit events (observer.*); nil: none.
	Observer *audit.Observer
	// OnStream receives each stream's result as soon as it is decided. An error stops the replay.
	OnStream func(StreamResult) error
	// Rules, if set, is the policy stage in place of cfg's (`policy learn` passes one with a
	// policy.Learner).
	Rules *policy.Policy

	// ReorderWait is how long, in capture time, reassembly waits for a missing segment before
	// calling it a gap. Default 60s.
	ReorderWait time.Duration
	// IdleClose ends a stream that has had no packet for this long in capture time; if it goes
	// on later it is a new, midstream stream. Default 2h: TCPStore connections idle for long.
	IdleClose time.Duration
	// MaxStreams bounds the streams held at once; beyond it the least recently active ends as
	// if idle. Default 262144.
	MaxStreams int
	// Reassembly buffer limits, in pages of 1900 bytes (out-of-order data waiting for a hole to
	// fill). Defaults 1024 per connection and 65536 in all (about 125 MB).
	MaxBufferedPagesPerConnection int
	MaxBufferedPagesTotal         int

	// alwaysReassemble gives every segment to the reassembler, as replay did before in-order
	// segments bypassed it; tests compare the two.
	alwaysReassemble bool
}

const (
	defaultReorderWait = 60 * time.Second
	defaultIdleClose   = 2 * time.Hour
	defaultMaxStreams  = 1 << 18
	defaultPagesPerCon = 1024
	defaultPagesTotal  = 1 << 16
	// flushEvery is the capture-time interval between reassembly flushes and idle sweeps.
	flushEvery = 5 * time.Second
	// doneLinger is how long a decided stream's 4-tuple keeps swallowing its trailing packets
	// (the last ACK after a FIN, the rest of a rejected stream) so they do not open a new stream.
	doneLinger = 2 * time.Minute
)

// Replay replays files in order, each a capture of its own, and returns what it saw. On a
// corrupt or truncated file it stops with a *CaptureError, after reporting the streams decided
// so far, the file's open streams included (judged as at the end of a capture).
func Replay(ctx context.Context, cfg config.Config, files []string, opts Options) (Summary, error) {
	r, err := New(cfg, opts)
	if err != nil {
		return Summary{}, err
	}
	var readErr error
	for _, f := range files {
		if readErr = r.ReadFile(ctx, f); readErr != nil {
			break
		}
	}
	return r.Summary(), errors.Join(readErr, r.Close())
}

// Replayer replays captures one after another with one configuration and one audit log.
type Replayer struct {
	cfg     config.Config
	dec     protocol.Config
	pol     guard.Policy // every stream's, as serve's: a capture is judged as serve would have
	adm     admission.Config
	opts    Options
	ports   [1024]uint64 // bit set of server ports
	audit   *audit.Writer
	flows   *verdict.Flows // with an audit file
	monitor bool           // cfg's mode is monitor: a violation comes to verdict.Of(v, true)
	sum     Summary
	nextID  uint64
	clock   time.Time // capture time, for the audit writer
	emitErr error
}

// New checks cfg and opts and opens the audit file, if any.
func New(cfg config.Config, opts Options) (*Replayer, error) {
	dec, err := cfg.Decoder()
	if err != nil {
		return nil, err
	}
	// serve learns G0 vs G1 from the store; a capture cannot ask it (see the package comment).
	dec.LegacyGen = protocol.G0
	if opts.ReorderWait <= 0 {
		opts.ReorderWait = defaultReorderWait
	}
	if opts.IdleClose <= 0 {
		opts.IdleClose = defaultIdleClose
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = defaultMaxStreams
	}
	if opts.MaxBufferedPagesPerConnection <= 0 {
		opts.MaxBufferedPagesPerConnection = defaultPagesPerCon
	}
	if opts.MaxBufferedPagesTotal <= 0 {
		opts.MaxBufferedPagesTotal = defaultPagesTotal
	}
	// Monitor stays off: a stream's judgement ends at its first violation in either mode; the mode
	// only names the action.
	rules := opts.Rules
	if rules == nil {
		if rules, err = cfg.Rules(); err != nil {
			return nil, err
		}
	}
	r := &Replayer{cfg: cfg, dec: dec, pol: guard.Policy{Deadlines: cfg.Deadlines(), Configured: dec.Gen}, opts: opts,
		adm: cfg.Admission(), monitor: cfg.Mode == config.ModeMonitor}
	if rules != nil {
		// Replay has no store to ask: a write-once key is known written when the capture wrote it,
		// the quota counts what the capture wrote from its start, and a round's store is known when
		// the capture wrote its MASTER_PORT.
		r.pol.Rules = rules.WithStore(policy.Store{Written: policy.NewWritten(1 << 16), Quota: policy.NewQuota(),
			JobStores: policy.NewJobStores(1<<10, r.jobStore), Appends: policy.NewAppends(1 << 16)})
	}
	ports := opts.Ports
	if len(ports) == 0 {
		ports = cfg.Replay.Ports
	}
	if len(ports) == 0 {
		return nil, errors.New("replay: no server port to select TCPStore streams by")
	}
	for _, p := range ports {
		if p == 0 {
			return nil, errors.New("replay: port 0 is not a server port")
		}
		r.ports[p/64] |= 1 << (p % 64)
	}
	if opts.AuditFile != "" {
		a := cfg.Audit
		w, err := audit.Open(opts.AuditFile, audit.Options{MaxBytes: a.MaxBytes, MaxBackups: a.MaxBackups,
			SeparateFlows: true, FlowsMaxBytes: a.FlowsMaxBytes, FlowsMaxBackups: a.FlowsMaxBackups,
			SampleFirst: a.SampleFirst, SampleEvery: a.SampleEvery, SampleWindow: a.SampleWindow,
			Clock: func() time.Time { return r.clock }, Observer: opts.Observer})
		if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		r.audit = w
		r.flows = verdict.NewFlows(r.writeAudit, 0)
	}
	return r, nil
}

func (r *Replayer) isPort(p uint16) bool { return r.ports[p/64]&(1<<(p%64)) != 0 }

// jobStore records a rendezvous round's store (policy.JobStores) on a port that is not one of
// the capture's guarded ports: torchrun's c10d rendezvous sends its ranks there, past the guard.
func (r *Replayer) jobStore(js policy.JobStore) {
	if r.isPort(js.Port) {
		return
	}
	if len(r.sum.JobStores) < maxJobStores {
		r.sum.JobStores = append(r.sum.JobStores, js)
	} else {
		r.sum.MoreJobStores++
	}
}

// Summary counts what has been replayed so far.
func (r *Replayer) Summary() Summary { return r.sum }

// Close flushes and closes the audit log.
func (r *Replayer) Close() error {
	if r.audit == nil {
		return nil
	}
	err := r.audit.Close()
	r.audit = nil
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

func (r *Replayer) emit(res StreamResult) {
	r.sum.add(&res)
	if r.opts.OnStream != nil && r.emitErr == nil {
		r.emitErr = r.opts.OnStream(res)
	}
}

func (r *Replayer) writeAudit(e audit.Event) {
	if r.audit == nil {
		return
	}
	if err := r.audit.Write(e); err != nil && r.emitErr == nil {
		r.emitErr = fmt.Errorf("audit: %w", err)
	}
}

// writeFlow writes s's flow record as serve does (verdict.Flows), its scan notice at once;
// sources are s's capture's.
func (r *Replayer) writeFlow(s *stream, sources *verdict.Sources) {
	if r.audit == nil {
		return
	}
	f := s.flowRecord()
	if notice, ok := r.flows.Write(&f, &r.cfg, sources); ok {
		r.writeAudit(notice)
	}
}

// CaptureError is a capture that cannot be read to its end.
type CaptureError struct {
	File   string
	Packet uint64 // 1-based number of the packet that could not be read; 0 for the file header
	Offset int64  // byte offset of that packet's record (of the decompressed data for gzip); -1 if unknown
	Err    error
}

func (e *CaptureError) Error() string {
	where := "file header"
	if e.Packet > 0 {
		where = fmt.Sprintf("packet %d", e.Packet)
	}
	if e.Offset >= 0 {
		where += fmt.Sprintf(" at byte offset %d", e.Offset)
	}
	return fmt.Sprintf("%s: %s: %v", e.File, where, e.Err)
}

func (e *CaptureError) Unwrap() error { return e.Err }
