package probe

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/proxy"
)

// silentStore accepts everything and answers GETNUMKEYS-sized requests with reply: an unguarded
// store that takes every header and waits for more.
func silentStore(t *testing.T, reply []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					// A read ending in GETNUMKEYS (0x06 in G0/G1, 0x07 from G2 on) gets an answer.
					if last := b[n-1]; reply != nil && (last == 0x06 || last == 0x07) {
						c.Write(reply)
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func TestUnguardedStoreIsExposed(t *testing.T) {
	o := Options{Gen: protocol.G0, Limits: protocol.DefaultLimits(), Timeout: 300 * time.Millisecond}
	res, err := Run(silentStore(t, nil), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Verdict != Exposed {
			t.Errorf("%s: %s (%s) against an unguarded store", r.Case, r.Verdict, r.Detail)
		}
	}
}

func TestGuardedStoreBlocksEverything(t *testing.T) {
	for _, gen := range []string{"1.13", "2.1", "2.6", "2.15"} {
		t.Run(gen, func(t *testing.T) {
			gs, _ := protocol.ParseGeneration(gen)
			reply := make([]byte, 12) // PING echo + i64
			cfg := config.Default()
			cfg.Listen, cfg.MetricsListen, cfg.Generation = "127.0.0.1:0", "", gen
			cfg.Upstream = silentStore(t, reply)
			srv, err := proxy.New(config.MustParse(cfg), proxy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Listen(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { srv.Serve(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			// As storeguard probe does: a guard with auto limits allows a legacy store more.
			res, err := Run(srv.Addr().String(), Options{Gen: gs.Gen, Limits: cfg.LoosestLimits(), Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) < 8 {
				t.Fatalf("only %d cases", len(res))
			}
			for _, r := range res {
				if r.Verdict != Blocked {
					t.Errorf("%s: %s (%s)", r.Case, r.Verdict, r.Detail)
				}
			}
		})
	}
}

func TestReal106294Bytes(t *testing.T) {
	cs := Cases(Options{Gen: protocol.G0, Limits: protocol.DefaultLimits(), Real106294: true})
	if got := cs[1].Bytes; string(got) != "\x03\x00\x00\x0b\x06\xe0\x00\x00\x00\x00\x00" {
		t.Errorf("real probe %x", got)
	}
	cs = Cases(Options{Gen: protocol.G0, Limits: protocol.DefaultLimits()})
	d := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G0}, Limits: protocol.DefaultLimits()})
	_, _, err := d.Scan(cs[1].Bytes)
	if v, ok := err.(*protocol.Violation); !ok || v.Rule != protocol.RuleKeyTooLong || v.Declared != 8193 {
		t.Errorf("default 106294 shape decodes as %v", err)
	}
}
