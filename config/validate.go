package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/idpattern"
	"github.com/storeguard/storeguard/nftset"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// Upper bounds keep every sum the proxy computes from these settings far
// from int64 overflow.
const (
	maxKeyBytes     = 1 << 30
	maxValueBytes   = 1 << 36
	maxMessageBytes = 1 << 40
	maxBudgetBytes  = 1 << 48
	maxCount        = 1 << 30
	maxConnections  = 1 << 24
	maxEventLoops   = 1024
	maxQuotaBytes   = 1 << 48
	maxQuotaKeys    = 1 << 28 // the account keeps about 40 bytes a key: 10 GiB at most
	maxRate         = 1e9
)

// compareSetOverhead is the fixed part of the largest single-key request,
// COMPARE_SET: opcode + three u64 lengths. A SET/APPEND/QUEUE_PUSH (17 fixed
// bytes) with a maximal key and value, or a COMPARE_SET that creates a
// maximal key with a maximal value, therefore always fits in
// max-message-bytes. (A COMPARE_SET with two maximal values need not.)
const compareSetOverhead = 25

// Validate checks every range and cross-field rule and returns all problems
// joined, each a *FieldError naming its key. Load calls it; call it yourself
// only for a Config built in code.
func (c Config) Validate() error { return errors.Join(c.validate(&Parsed{})...) }

// validate checks c, keeping in p what it parses along the way (Parse).
func (c Config) validate(p *Parsed) []error {
	var v validator

	v.address("listen", c.Listen, 0)
	v.address("upstream", c.Upstream, 1)
	if c.MetricsListen != "" {
		v.address("metrics-listen", c.MetricsListen, 0)
	}
	if v.ok("listen", "upstream") && sameEndpoint(c.Listen, c.Upstream) {
		v.add("upstream", "%q points back at listen %q; the proxy would connect to itself", c.Upstream, c.Listen)
	}
	if c.MetricsListen != "" && v.ok("listen", "metrics-listen") && sameEndpoint(c.Listen, c.MetricsListen) {
		v.add("metrics-listen", "%q is the same address as listen %q", c.MetricsListen, c.Listen)
	}
	if err := checkGeneration(c.Generation); err != nil {
		v.add("generation", "%v", err)
	}
	oneOf(&v, "backend", string(c.Backend), BackendAuto, BackendLegacy, BackendLibUV)
	oneOf(&v, "mode", string(c.Mode), ModeEnforce, ModeMonitor)
	v.between("event-loops", int64(c.EventLoops), -1, maxEventLoops)

	l := c.Limits
	v.between("limits.max-key-bytes", l.MaxKeyBytes, 1, maxKeyBytes)
	v.byteLimit("limits.max-value-bytes", l.MaxValueBytes, maxValueBytes)
	v.between("limits.max-keys", l.MaxKeys, 1, maxCount)
	v.byteLimit("limits.max-message-bytes", l.MaxMessageBytes, maxMessageBytes)
	v.between("limits.max-pending-replies", int64(l.MaxPendingReplies), 1, protocol.MaxAwaited)
	limitsOK := v.ok("limits.max-key-bytes", "limits.max-value-bytes", "limits.max-message-bytes")
	// An auto max-message-bytes always fits a maximal SET; an auto max-value-bytes on a legacy
	// store is lowered to fit, and must fit as libuv's.
	if limitsOK && l.MaxMessageBytes != AutoLimit {
		value, name := int64(l.MaxValueBytes), "limits.max-value-bytes"
		if l.MaxValueBytes == AutoLimit {
			value, name = autoValueBytes, fmt.Sprintf("limits.max-value-bytes (auto: %d for a libuv store)", autoValueBytes)
		}
		if need := l.MaxKeyBytes + value + compareSetOverhead; int64(l.MaxMessageBytes) < need {
			v.add("limits.max-message-bytes", "must be at least limits.max-key-bytes + %s + %d = %d so a maximal SET fits, got %d",
				name, compareSetOverhead, need, l.MaxMessageBytes)
		}
	}

	t := c.Timeouts
	v.positive("timeouts.upstream-dial", t.UpstreamDial)
	v.positive("timeouts.message", t.Message)
	v.notNegative("timeouts.first-message", t.FirstMessage)
	v.notNegative("timeouts.idle", t.Idle)
	v.positive("timeouts.reply-read", t.ReplyRead)
	v.notNegative("timeouts.drain", t.Drain)

	v.prefixes("access.allow", c.Access.Allow)
	v.prefixes("access.deny", c.Access.Deny)
	v.prefixes("ban.exempt", c.Ban.Exempt)
	for i, s := range c.Access.DenyIdentities {
		if pat, err := idpattern.Parse(s); err != nil {
			v.add(fmt.Sprintf("access.deny-identities[%d]", i), "%v", err)
		} else {
			p.admission.DenyIdentities = append(p.admission.DenyIdentities, pat)
		}
	}

	cp := c.Caps
	if !cp.MaxConnections.Auto {
		v.between("caps.max-connections", int64(cp.MaxConnections.N), 1, maxConnections)
	}
	v.between("caps.per-source-connections", int64(cp.PerSourceConnections), 0, maxConnections)
	v.rate("caps.per-source-rate", "caps.per-source-burst", cp.PerSourceRate, cp.PerSourceBurst)
	v.between("caps.per-identity-connections", int64(cp.PerIdentityConnections), 0, maxConnections)
	v.between("caps.per-source-silent", int64(cp.PerSourceSilent), 0, maxConnections)
	if !cp.PerPrefixConnections.Auto {
		v.between("caps.per-prefix-connections", int64(cp.PerPrefixConnections.N), 0, maxConnections)
	}
	v.between("caps.ipv4-prefix", int64(cp.IPv4Prefix), 1, 32)
	v.between("caps.ipv6-prefix", int64(cp.IPv6Prefix), 1, 128)
	if !cp.MaxStoreConnections.Auto {
		v.between("caps.max-store-connections", int64(cp.MaxStoreConnections.N), 0, maxConnections)
	}
	v.between("caps.per-source-store-connections", int64(cp.PerSourceStoreConnections), 0, maxConnections)
	if cp.StoreDialRate.Auto {
		v.between("caps.store-dial-burst", int64(cp.StoreDialBurst), 0, maxConnections)
	} else {
		v.rate("caps.store-dial-rate", "caps.store-dial-burst", cp.StoreDialRate.Rate, cp.StoreDialBurst)
	}
	v.durationBetween("caps.store-dial-slow", cp.StoreDialSlow, 10*time.Millisecond, time.Minute)
	v.rate("caps.per-source-store-dial-rate", "caps.per-source-store-dial-burst", cp.PerSourceStoreDialRate,
		cp.PerSourceStoreDialBurst)
	v.between("caps.buffer-budget-bytes", cp.BufferBudgetBytes, 1, maxBudgetBytes)
	v.between("caps.per-source-budget-bytes", cp.PerSourceBudgetBytes, 0, maxBudgetBytes)
	v.between("caps.reply-buffer-bytes", cp.ReplyBufferBytes, 64<<10, maxBudgetBytes)
	if limitsOK && v.ok("caps.buffer-budget-bytes") {
		message := int64(max(c.LimitsFor(protocol.BackendLibuv).MaxMessageBytes, c.LimitsFor(protocol.BackendLegacy).MaxMessageBytes))
		auto := ""
		if l.MaxMessageBytes == AutoLimit {
			auto = "auto: "
		}
		if cp.BufferBudgetBytes < message {
			v.add("caps.buffer-budget-bytes", "must be at least limits.max-message-bytes (%s%d) or a maximal message can never be buffered, got %d",
				auto, message, cp.BufferBudgetBytes)
		}
	}

	b := c.Ban
	v.between("ban.violations", int64(b.Violations), 0, maxCount)
	v.notNegative("ban.window", b.Window)
	v.notNegative("ban.duration", b.Duration)
	if b.Violations > 0 {
		if v.ok("ban.window") && b.Window == 0 {
			v.add("ban.window", "must be positive when ban.violations is set (%d), got 0s", b.Violations)
		}
		if v.ok("ban.duration") && b.Duration == 0 {
			v.add("ban.duration", "must be positive when ban.violations is set (%d), got 0s", b.Violations)
		}
	}

	tl := c.TLS
	oneOf(&v, "tls.mode", tl.Mode, "off", "on")
	v.prefixes("tls.plaintext-sources", tl.PlaintextSources)
	v.positive("tls.handshake-timeout", tl.HandshakeTimeout)
	if tl.PeerSet != "" {
		var err error
		if p.peerSet, err = nftset.Parse(tl.PeerSet); err != nil {
			v.add("tls.peer-set", "%v", err)
		} else if !tl.On() {
			v.add("tls.peer-set", "is set while tls.mode is off: it holds the hosts a TLS handshake proved, and there are none")
		}
	}
	if (tl.PeerSet != "" || tl.PeerSetTimeout != 0) && (tl.PeerSetTimeout < 4*time.Second || tl.PeerSetTimeout > 24*time.Hour) {
		v.add("tls.peer-set-timeout", "must be between 4s and 24h, got %s", tl.PeerSetTimeout)
	}
	var err error
	if p.keyExchange, err = identity.ParseGroups(tl.KeyExchange); err != nil {
		v.add("tls.key-exchange", "%v", err)
	}
	allow := make(idpattern.Set, 0, len(tl.Allow))
	for i, s := range tl.Allow {
		if pat, err := idpattern.Parse(s); err != nil {
			v.add(fmt.Sprintf("tls.allow[%d]", i), "%v", err)
		} else {
			allow = append(allow, pat)
		}
	}
	p.allow = identity.AllowOf(allow)
	if tl.On() {
		files := tl.CertFile != "" || tl.KeyFile != "" || tl.CAFile != ""
		switch {
		case tl.SPIFFESocket != "" && files:
			v.add("tls.spiffe-socket", "is set with tls.cert-file, tls.key-file or tls.ca-file: take the identity from one or the other")
		case tl.SPIFFESocket == "":
			for _, f := range []struct{ key, val string }{{"tls.cert-file", tl.CertFile}, {"tls.key-file", tl.KeyFile}, {"tls.ca-file", tl.CAFile}} {
				if f.val == "" {
					v.add(f.key, "must be set while tls.mode is on (or set tls.spiffe-socket)")
				}
			}
		}
	}

	q := c.Quota
	oneOf(&v, "quota.mode", q.Mode, "enforce", "monitor", "off")
	v.between("quota.store-bytes", q.StoreBytes, 0, maxQuotaBytes)
	v.between("quota.per-source-store-bytes", q.PerSourceStoreBytes, 0, maxQuotaBytes)
	v.between("quota.store-keys", q.StoreKeys, 0, maxQuotaKeys)
	v.between("quota.per-source-store-keys", q.PerSourceStoreKeys, 0, maxQuotaKeys)
	if v.ok("quota.mode", "quota.store-keys") && q.Mode != "off" && q.StoreKeys == 0 {
		// The account's memory is bounded by its key cap (about 40 bytes a key).
		v.add("quota.store-keys", "must be set (1 to %d) while quota.mode is %s: it bounds the account's memory", int64(maxQuotaKeys), q.Mode)
	}

	oneOf(&v, "policy.rendezvous-state", c.Policy.RendezvousState, "enforce", "monitor", "off")
	oneOf(&v, "policy.pickle-globals", c.Policy.PickleGlobals, "enforce", "monitor", "off")
	oneOf(&v, "policy.value-split", c.Policy.ValueSplit, "enforce", "monitor", "off")
	oneOf(&v, "policy.reply-size", c.Policy.ReplySize, "enforce", "monitor", "off")
	oneOf(&v, "policy.write-once", c.Policy.WriteOnce, "enforce", "monitor", "off")
	if v.ok("policy.rendezvous-state", "policy.pickle-globals", "policy.value-split", "policy.reply-size", "policy.write-once", "quota.mode") {
		if p.rules, err = c.Rules(); err != nil {
			v.errs = append(v.errs, err)
		}
	} else if c.Policy.File != "" { // the file's problems too, all at once
		if _, err := policy.LoadFile(c.Policy.File); err != nil {
			v.add("policy.file", "%v", err)
		}
	}

	a := c.Audit
	v.between("audit.max-bytes", a.MaxBytes, 1, maxBudgetBytes)
	v.between("audit.max-backups", int64(a.MaxBackups), 0, 10000)
	v.between("audit.flows-max-bytes", a.FlowsMaxBytes, 1, maxBudgetBytes)
	v.between("audit.flows-max-backups", int64(a.FlowsMaxBackups), 0, 10000)
	v.between("audit.sample-first", int64(a.SampleFirst), 0, maxCount)
	v.between("audit.sample-every", int64(a.SampleEvery), 1, maxCount)
	v.positive("audit.sample-window", a.SampleWindow)
	v.notNegative("audit.flow-interim", a.FlowInterim)
	oneOf(&v, "flows", string(c.Flows), FlowsAll, FlowsSuspicious, FlowsOff)
	oneOf(&v, "upstream-loopback", string(c.UpstreamLoopback), UpstreamLoopbackAuto, UpstreamLoopbackAsWritten)
	v.notNegative("ban.peek", c.Ban.Peek)
	v.rate("ban.serving-rate", "ban.serving-burst", c.Ban.ServingRate, c.Ban.ServingBurst)
	v.between("scan.threshold", int64(c.Scan.Threshold), 0, maxCount)
	if c.Scan.Threshold > 0 {
		v.positive("scan.window", c.Scan.Window)
	}

	if _, ok := levelName(c.Log.Level); !ok {
		v.add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level.String())
	}
	oneOf(&v, "log.format", string(c.Log.Format), LogJSON, LogText)

	if len(c.Replay.Ports) == 0 {
		v.add("replay.ports", "must list at least one port")
	}
	for i, p := range c.Replay.Ports {
		if p == 0 {
			v.add(fmt.Sprintf("replay.ports[%d]", i), "must be between 1 and 65535, got 0")
		}
	}
	return v.errs
}

type validator struct {
	errs []error
	bad  map[string]bool // keys already reported, so cross-field rules skip them
}

func (v *validator) add(key, format string, args ...any) {
	if v.bad == nil {
		v.bad = make(map[string]bool)
	}
	v.bad[key] = true
	v.errs = append(v.errs, fieldErr(key, format, args...))
}

// ok reports whether none of keys has an error yet.
func (v *validator) ok(keys ...string) bool {
	for _, k := range keys {
		if v.bad[k] {
			return false
		}
	}
	return true
}

func (v *validator) between(key string, n, lo, hi int64) {
	if n < lo || n > hi {
		v.add(key, "must be between %d and %d, got %d", lo, hi, n)
	}
}

// rate checks a token bucket's rate a second (0: unlimited) and its burst, at least 1 with a rate.
func (v *validator) rate(rateKey, burstKey string, rate float64, burst int) {
	if rate < 0 || rate > maxRate || rate != rate {
		v.add(rateKey, "must be between 0 and %g, got %g", float64(maxRate), rate)
	}
	v.between(burstKey, int64(burst), 0, maxConnections)
	if v.ok(rateKey, burstKey) && rate > 0 && burst < 1 {
		v.add(burstKey, "must be at least 1 when %s is set, got %d", rateKey, burst)
	}
}

// byteLimit checks a limit that is auto or between 1 and hi bytes.
func (v *validator) byteLimit(key string, b ByteLimit, hi int64) {
	if b < 0 || int64(b) > hi {
		v.add(key, "must be auto or between 1 and %d, got %d", hi, int64(b))
	}
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.add(key, "must be positive, got %s", d)
	}
}

func (v *validator) durationBetween(key string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		v.add(key, "must be between %s and %s, got %s", lo, hi, d)
	}
}

func (v *validator) notNegative(key string, d time.Duration) {
	if d < 0 {
		v.add(key, "must not be negative, got %s", d)
	}
}

func oneOf[T ~string](v *validator, key, got string, allowed ...T) {
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if string(a) == got {
			return
		}
		names[i] = string(a)
	}
	v.add(key, "%q is not one of %s", got, strings.Join(names, ", "))
}

func (v *validator) prefixes(key string, ps []netip.Prefix) {
	for i, p := range ps {
		k := fmt.Sprintf("%s[%d]", key, i)
		switch {
		case !p.IsValid():
			v.add(k, "is not a valid CIDR")
		case p.Addr().Is4In6():
			v.add(k, "%s is IPv4-mapped and would never match; write %s", p, ipv4Form(p))
		case p != p.Masked():
			v.add(k, "%s has host bits set; did you mean %s?", p, p.Masked())
		}
	}
}

func ipv4Form(p netip.Prefix) string {
	bits := p.Bits() - 96
	if bits < 0 {
		bits = 0
	}
	return netip.PrefixFrom(p.Addr().Unmap(), bits).Masked().String()
}

// address checks host:port with a numeric port of at least minPort.
func (v *validator) address(key, addr string, minPort int) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		if _, perr := strconv.ParseUint(addr, 10, 16); perr == nil {
			v.add(key, "%q is not host:port; did you mean \":%s\"?", addr, addr)
			return
		}
		v.add(key, "%q is not host:port", addr)
		return
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || int(n) < minPort {
		v.add(key, "%q: port must be a number between %d and 65535", addr, minPort)
	}
}

// sameEndpoint reports whether a listener on listen would accept connections
// dialed to other: same port and overlapping hosts. It is a best effort, as
// it cannot see this machine's interface addresses; port 0 never clashes.
func sameEndpoint(listen, other string) bool {
	lh, lp, err1 := net.SplitHostPort(listen)
	oh, op, err2 := net.SplitHostPort(other)
	if err1 != nil || err2 != nil {
		return false
	}
	ln, err1 := strconv.ParseUint(lp, 10, 16)
	on, err2 := strconv.ParseUint(op, 10, 16)
	if err1 != nil || err2 != nil || ln != on || ln == 0 {
		return false
	}
	if strings.EqualFold(lh, oh) {
		return true
	}
	lw, ow := isWildcard(lh), isWildcard(oh)
	ll, ol := isLoopback(lh), isLoopback(oh)
	return lw && (ow || ol) || ow && ll || ll && ol
}

func isWildcard(host string) bool {
	if host == "" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsUnspecified()
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// checkGeneration accepts the generation spellings protocol.ParseGeneration
// defines (auto, a G-name, a torch release), so they live in one place.
func checkGeneration(s string) error {
	_, err := protocol.ParseGeneration(s)
	return err
}
