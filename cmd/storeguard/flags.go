package main

import (
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"github.com/storeguard/storeguard/config"
)

// addServeFlags registers the flags that override config keys: --config (the
// file) and one flag per top-level key of the same name, plus --log-level and
// --log-format. Defaults shown in help are the built-in ones; a flag only
// overrides the file and env when it is given.
func addServeFlags(fs *pflag.FlagSet) {
	d := config.Default()
	fs.String("config", "", "YAML config file (also $STOREGUARD_CONFIG); flags override it")
	fs.String("listen", d.Listen, "address clients connect to")
	fs.String("upstream", d.Upstream, "address of the real TCPStore")
	fs.String("upstream-loopback", string(d.UpstreamLoopback), "auto: dial [::1] for a 127.x upstream the store listens for only on [::], whose name /etc/hosts gives the store | as-written")
	fs.String("metrics-listen", d.MetricsListen, `Prometheus /metrics address; "" disables`)
	fs.String("audit-log", d.AuditLog, `audit JSONL file; "" sends audit events to the log`)
	fs.String("flows", string(d.Flows), "flow records in the audit log (passed ones in AUDIT-LOG.flows): all | suspicious | off")
	fs.String("generation", d.Generation, "store generation: auto | G0..G6 | torch release MAJOR.MINOR")
	fs.String("backend", string(d.Backend), "store backend: auto | legacy | libuv")
	fs.String("mode", string(d.Mode), "enforce | monitor")
	fs.Int("event-loops", d.EventLoops, "event loops accepting and forwarding connections: 0 = one per CPU, -1 = none")
	fs.String("log-level", strings.ToLower(d.Log.Level.String()), "debug | info | warn | error")
	fs.String("log-format", string(d.Log.Format), "json | text")
	addTLSFlags(fs)
	fs.String("tls-mode", d.TLS.Mode, "off | on: clients from outside --tls-plaintext-sources must complete mutual TLS 1.3")
	fs.StringSlice("tls-plaintext-sources", nil, "CIDRs that may still speak plaintext (default loopback)")
	fs.String("tls-peer-set", d.TLS.PeerSet, "nftables sets (\"family table set\", and set+\"6\") kept filled with the addresses of hosts whose handshake passed (configs/nftables/storeguard-peers.nft)")
}

// addTLSFlags registers the flags of where a guard's identity comes from and whom it accepts:
// serve's and connect's.
func addTLSFlags(fs *pflag.FlagSet) {
	fs.String("tls-cert", "", "this guard's certificate chain (PEM), re-read when it changes")
	fs.String("tls-key", "", "its private key (PEM)")
	fs.String("tls-ca", "", "CAs a peer's certificate must chain to (PEM), re-read when it changes")
	fs.String("tls-spiffe-socket", "", "SPIFFE Workload API socket (unix:///...): SVID and bundle from it instead of the files")
	fs.StringSlice("tls-allow", nil, "identities allowed (repeatable): spiffe://td/path (* one segment, ** the rest), dns:, uri:, cn:")
	fs.StringSlice("tls-key-exchange", nil, "key exchange groups, most preferred first (x25519mlkem768, x25519, p-256, ...); none = Go's own, a post-quantum hybrid first")
	fs.Bool("tls-resumption", true, "TLS session resumption between guards (tickets): no certificate signed or sent again, the peer's still checked")
}

// flagAliases map flag names that are not keys themselves.
var flagAliases = map[string]string{
	"log-level":             "log.level",
	"log-format":            "log.format",
	"tls-mode":              "tls.mode",
	"tls-cert":              "tls.cert-file",
	"tls-key":               "tls.key-file",
	"tls-ca":                "tls.ca-file",
	"tls-spiffe-socket":     "tls.spiffe-socket",
	"tls-allow":             "tls.allow",
	"tls-plaintext-sources": "tls.plaintext-sources",
	"tls-key-exchange":      "tls.key-exchange",
	"tls-resumption":        "tls.resumption",
	"tls-peer-set":          "tls.peer-set",
}

// flagKey returns the config key the flag name sets, or "" if it sets none.
func flagKey(name string) string {
	if k, ok := flagAliases[name]; ok {
		return k
	}
	if slices.Contains(config.Keys(), name) {
		return name
	}
	return ""
}

// loadOptions are config.Load's options for a command's parsed flags: --config
// names the file, and each flag given whose name is a key (or an alias of
// one) sets it, whatever the flag's type.
func loadOptions(fs *pflag.FlagSet) config.Options {
	var opts config.Options
	if f := fs.Lookup("config"); f != nil {
		opts.File = f.Value.String()
	}
	fs.Visit(func(f *pflag.Flag) { // Visit sees only flags that were given
		if key := flagKey(f.Name); key != "" {
			opts.Flags = append(opts.Flags, config.Flag{Key: key, Name: f.Name, Value: flagText(f)})
		}
	})
	return opts
}

// flagText is a flag's value as config reads it: a list flag's items
// comma-separated.
func flagText(f *pflag.Flag) string {
	if s, ok := f.Value.(pflag.SliceValue); ok {
		return strings.Join(s.GetSlice(), ",")
	}
	return f.Value.String()
}
