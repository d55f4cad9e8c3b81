package config

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// YAML renders c with the same keys, order and comments as the default
// file, so `storeguard config check` shows the effective configuration in a
// form Load reads back to the same Config.
func (c Config) YAML() ([]byte, error) {
	values, err := c.nodes()
	if err != nil {
		return nil, err
	}
	root, err := parseDoc(defaultYAML)
	if err != nil {
		return nil, err
	}
	if err := fill(root, "", values); err != nil {
		return nil, err
	}
	if len(values) > 0 {
		return nil, fmt.Errorf("config: YAML: keys missing from default.yaml: %v", values)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// fill replaces each leaf value of the template with values[key], keeping
// the template's comments, and deletes what it used from values.
func fill(n *yaml.Node, prefix string, values map[string]*yaml.Node) error {
	for i := 0; i+1 < len(n.Content); i += 2 {
		key := join(prefix, n.Content[i].Value)
		old := n.Content[i+1]
		if old.Kind == yaml.MappingNode {
			if err := fill(old, key, values); err != nil {
				return err
			}
			continue
		}
		v, ok := values[key]
		if !ok {
			return fmt.Errorf("config: YAML: no value for %s", key)
		}
		delete(values, key)
		v.HeadComment, v.LineComment, v.FootComment = old.HeadComment, old.LineComment, old.FootComment
		n.Content[i+1] = v
	}
	return nil
}

func (c Config) nodes() (map[string]*yaml.Node, error) {
	level, ok := levelName(c.Log.Level)
	if !ok {
		return nil, fmt.Errorf("config: YAML: log.level %v has no name", c.Log.Level)
	}
	str := func(s string) *yaml.Node {
		n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
		if !plainWord(s) {
			n.Style = yaml.DoubleQuotedStyle // addresses, paths, CIDRs: quoted for every YAML reader
		}
		return n
	}
	num := func(n int64) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(n, 10)}
	}
	dur := func(d time.Duration) *yaml.Node { return str(formatDuration(d)) }
	size := func(b ByteLimit) *yaml.Node {
		if b == AutoLimit {
			return str(b.String())
		}
		return num(int64(b))
	}
	boolean := func(b bool) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
	}
	list := func(items []*yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle, Content: items}
	}
	prefixes := func(ps []netip.Prefix) *yaml.Node {
		items := make([]*yaml.Node, len(ps))
		for i, p := range ps {
			items[i] = str(p.String())
		}
		return list(items)
	}
	autoCount := func(a AutoCount) *yaml.Node {
		if a.Auto {
			return str("auto")
		}
		return num(int64(a.N))
	}
	strs := func(ss []string) []*yaml.Node {
		items := make([]*yaml.Node, len(ss))
		for i, s := range ss {
			items[i] = str(s)
		}
		return items
	}
	ports := make([]*yaml.Node, len(c.Replay.Ports))
	for i, p := range c.Replay.Ports {
		ports[i] = num(int64(p))
	}
	rate := func(r float64) *yaml.Node {
		if r == float64(int64(r)) {
			return num(int64(r))
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(r, 'g', -1, 64)}
	}
	autoRate := func(a AutoRate) *yaml.Node {
		if a.Auto {
			return str("auto")
		}
		return rate(a.Rate)
	}

	return map[string]*yaml.Node{
		"listen":            str(c.Listen),
		"upstream":          str(c.Upstream),
		"upstream-loopback": str(string(c.UpstreamLoopback)),
		"metrics-listen":    str(c.MetricsListen),
		"audit-log":         str(c.AuditLog),
		"flows":             str(string(c.Flows)),
		"generation":        str(c.Generation),
		"backend":           str(string(c.Backend)),
		"mode":              str(string(c.Mode)),
		"event-loops":       num(int64(c.EventLoops)),

		"limits.max-key-bytes":              num(c.Limits.MaxKeyBytes),
		"limits.max-value-bytes":            size(c.Limits.MaxValueBytes),
		"limits.max-keys":                   num(c.Limits.MaxKeys),
		"limits.max-message-bytes":          size(c.Limits.MaxMessageBytes),
		"limits.block-watch-key":            boolean(c.Limits.BlockWatchKey),
		"limits.reject-zero-count":          boolean(c.Limits.RejectZeroCount),
		"limits.max-pending-replies":        num(int64(c.Limits.MaxPendingReplies)),
		"timeouts.upstream-dial":            dur(c.Timeouts.UpstreamDial),
		"timeouts.message":                  dur(c.Timeouts.Message),
		"timeouts.first-message":            dur(c.Timeouts.FirstMessage),
		"timeouts.idle":                     dur(c.Timeouts.Idle),
		"timeouts.reply-read":               dur(c.Timeouts.ReplyRead),
		"timeouts.drain":                    dur(c.Timeouts.Drain),
		"access.allow":                      prefixes(c.Access.Allow),
		"access.deny":                       prefixes(c.Access.Deny),
		"access.deny-identities":            list(strs(c.Access.DenyIdentities)),
		"tls.mode":                          str(c.TLS.Mode),
		"tls.cert-file":                     str(c.TLS.CertFile),
		"tls.key-file":                      str(c.TLS.KeyFile),
		"tls.ca-file":                       str(c.TLS.CAFile),
		"tls.spiffe-socket":                 str(c.TLS.SPIFFESocket),
		"tls.allow":                         list(strs(c.TLS.Allow)),
		"tls.plaintext-sources":             prefixes(c.TLS.PlaintextSources),
		"tls.handshake-timeout":             dur(c.TLS.HandshakeTimeout),
		"tls.key-exchange":                  list(strs(c.TLS.KeyExchange)),
		"tls.resumption":                    boolean(c.TLS.Resumption),
		"tls.peer-set":                      str(c.TLS.PeerSet),
		"tls.peer-set-timeout":              dur(c.TLS.PeerSetTimeout),
		"caps.max-connections":              autoCount(c.Caps.MaxConnections),
		"caps.per-source-connections":       num(int64(c.Caps.PerSourceConnections)),
		"caps.per-source-rate":              rate(c.Caps.PerSourceRate),
		"caps.per-source-burst":             num(int64(c.Caps.PerSourceBurst)),
		"caps.per-identity-connections":     num(int64(c.Caps.PerIdentityConnections)),
		"caps.per-source-silent":            num(int64(c.Caps.PerSourceSilent)),
		"caps.per-prefix-connections":       autoCount(c.Caps.PerPrefixConnections),
		"caps.ipv4-prefix":                  num(int64(c.Caps.IPv4Prefix)),
		"caps.ipv6-prefix":                  num(int64(c.Caps.IPv6Prefix)),
		"caps.max-store-connections":        autoCount(c.Caps.MaxStoreConnections),
		"caps.per-source-store-connections": num(int64(c.Caps.PerSourceStoreConnections)),
		"caps.store-dial-rate":              autoRate(c.Caps.StoreDialRate),
		"caps.store-dial-burst":             num(int64(c.Caps.StoreDialBurst)),
		"caps.store-dial-slow":              dur(c.Caps.StoreDialSlow),
		"caps.per-source-store-dial-rate":   rate(c.Caps.PerSourceStoreDialRate),
		"caps.per-source-store-dial-burst":  num(int64(c.Caps.PerSourceStoreDialBurst)),
		"caps.buffer-budget-bytes":          num(c.Caps.BufferBudgetBytes),
		"caps.per-source-budget-bytes":      num(c.Caps.PerSourceBudgetBytes),
		"caps.reply-buffer-bytes":           num(c.Caps.ReplyBufferBytes),
		"ban.violations":                    num(int64(c.Ban.Violations)),
		"ban.window":                        dur(c.Ban.Window),
		"ban.duration":                      dur(c.Ban.Duration),
		"ban.exempt":                        prefixes(c.Ban.Exempt),
		"ban.peek":                          dur(c.Ban.Peek),
		"ban.serving-rate":                  rate(c.Ban.ServingRate),
		"ban.serving-burst":                 num(int64(c.Ban.ServingBurst)),
		"policy.rendezvous-state":           str(c.Policy.RendezvousState),
		"policy.pickle-globals":             str(c.Policy.PickleGlobals),
		"policy.value-split":                str(c.Policy.ValueSplit),
		"policy.reply-size":                 str(c.Policy.ReplySize),
		"policy.write-once":                 str(c.Policy.WriteOnce),
		"policy.deny-globals":               list(strs(c.Policy.DenyGlobals)),
		"policy.file":                       str(c.Policy.File),
		"quota.mode":                        str(c.Quota.Mode),
		"quota.store-bytes":                 num(c.Quota.StoreBytes),
		"quota.per-source-store-bytes":      num(c.Quota.PerSourceStoreBytes),
		"quota.store-keys":                  num(c.Quota.StoreKeys),
		"quota.per-source-store-keys":       num(c.Quota.PerSourceStoreKeys),
		"scan.threshold":                    num(int64(c.Scan.Threshold)),
		"scan.window":                       dur(c.Scan.Window),
		"audit.max-bytes":                   num(c.Audit.MaxBytes),
		"audit.max-backups":                 num(int64(c.Audit.MaxBackups)),
		"audit.flows-max-bytes":             num(c.Audit.FlowsMaxBytes),
		"audit.flows-max-backups":           num(int64(c.Audit.FlowsMaxBackups)),
		"audit.sample-first":                num(int64(c.Audit.SampleFirst)),
		"audit.sample-every":                num(int64(c.Audit.SampleEvery)),
		"audit.sample-window":               dur(c.Audit.SampleWindow),
		"audit.flow-interim":                dur(c.Audit.FlowInterim),
		"log.level":                         str(level),
		"log.format":                        str(string(c.Log.Format)),
		"replay.ports":                      list(ports),
	}, nil
}

// formatDuration writes whole hours, minutes or seconds without the zero
// parts time.Duration.String adds ("10m", not "10m0s").
func formatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return d.String()
}

func plainWord(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}
