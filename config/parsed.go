package config

import (
	"crypto/tls"
	"errors"

	"github.com/storeguard/storeguard/admission"
	"github.com/storeguard/storeguard/identity"
	"github.com/storeguard/storeguard/nftset"
	"github.com/storeguard/storeguard/policy"
	"github.com/storeguard/storeguard/protocol"
)

// Parsed is a configuration that validated, with the values validating it parsed: serve runs on
// it, so nothing is parsed twice, and the policy file is read once (what was validated is what
// runs, even if the file changes after). Only Parse and LoadParsed make one.
type Parsed struct {
	cfg         Config
	decoder     protocol.Config
	rules       *policy.Policy
	allow       identity.Allow
	keyExchange []tls.CurveID
	peerSet     nftset.Spec
	admission   admission.Config
}

// Parse validates c (Validate) and parses it once, for serve.
func Parse(c Config) (*Parsed, error) {
	p, errs := c.parse()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// MustParse is Parse for a configuration known to be valid (tests, code that built it); it panics
// on an error.
func MustParse(c Config) *Parsed {
	p, err := Parse(c)
	if err != nil {
		panic(err)
	}
	return p
}

// Config is the configuration p was parsed from.
func (p *Parsed) Config() Config { return p.cfg }

// Decoder is Config.Decoder's: the protocol decoder's settings.
func (p *Parsed) Decoder() protocol.Config { return p.decoder }

// Rules is Config.Rules's: the policy stage, its file read once; nil when it is off. It is
// shared: give it a store with WithStore, which copies it.
func (p *Parsed) Rules() *policy.Policy { return p.rules }

// Allow is tls.allow: the identities mutual TLS admits.
func (p *Parsed) Allow() identity.Allow { return p.allow }

// KeyExchange is tls.key-exchange: the TLS handshake's key-exchange groups, in order.
func (p *Parsed) KeyExchange() []tls.CurveID { return p.keyExchange }

// PeerSet is tls.peer-set, and whether it is set.
func (p *Parsed) PeerSet() (nftset.Spec, bool) { return p.peerSet, p.cfg.TLS.PeerSet != "" }

// Admission is Config.Admission's: the admission policy, its identity patterns parsed and its
// automatic connection caps worked out as the configuration was parsed.
func (p *Parsed) Admission() admission.Config { return p.admission }

// parse validates c, as Validate, and keeps what it parsed: the errors, or c parsed.
func (c Config) parse() (*Parsed, []error) {
	p := &Parsed{cfg: c}
	if errs := c.validate(p); len(errs) > 0 {
		return nil, errs
	}
	if err := p.finish(); err != nil {
		return nil, []error{err}
	}
	return p, nil
}

// finish works out, once p's configuration validated, what follows from what validate parsed:
// the decoder's settings and the admission policy.
func (p *Parsed) finish() (err error) {
	p.decoder, err = p.cfg.Decoder()
	p.admission = p.cfg.admission(p.admission.DenyIdentities)
	return err
}
