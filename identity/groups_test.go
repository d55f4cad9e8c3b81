package identity

import (
	"crypto/tls"
	"reflect"
	"testing"

	"github.com/storeguard/storeguard/internal/testpki"
)

func TestParseGroups(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  []tls.CurveID
		err   string
	}{
		{nil, nil, ""},
		{[]string{"x25519"}, []tls.CurveID{tls.X25519}, ""},
		{[]string{"X25519MLKEM768", " x25519 ", "prime256v1", "secp384r1", "P521"},
			[]tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256, tls.CurveP384, tls.CurveP521}, ""},
		{[]string{"secp256r1mlkem768", "secp384r1mlkem1024"}, []tls.CurveID{tls.SecP256r1MLKEM768, tls.SecP384r1MLKEM1024}, ""},
		{[]string{"x448"}, nil, `unknown key exchange group "x448" (want one of x25519mlkem768, secp256r1mlkem768, secp384r1mlkem1024, x25519, p-256, p-384, p-521)`},
		{[]string{"p-256", "secp256r1"}, nil, `key exchange group "secp256r1" named twice`},
	} {
		got, err := ParseGroups(tc.names)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: error %v, want %s", tc.names, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.names, got, err, tc.want)
		}
	}
}

// The groups set on the guards' configs are the ones the handshake uses: a client guard left at
// crypto/tls's own (a hybrid first) meets a server that takes x25519 only, and the other way
// round; two guards with no group in common do not connect.
func TestKeyExchangeGroups(t *testing.T) {
	ca := testpki.NewCA(t, "ca")
	store := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/store"}}), ca)
	worker := source(ca.Issue(t, testpki.Leaf{URIs: []string{"spiffe://td/worker/1"}}), ca)
	for _, tc := range []struct {
		name           string
		server, client []tls.CurveID
		want           tls.CurveID // 0: no handshake
	}{
		{"both Go's own", nil, nil, tls.X25519MLKEM768},
		{"server x25519 only", []tls.CurveID{tls.X25519}, nil, tls.X25519},
		{"client x25519 only", nil, []tls.CurveID{tls.X25519}, tls.X25519},
		{"client p-256 only", nil, []tls.CurveID{tls.CurveP256}, tls.CurveP256},
		// The server's order wins where both take a group (after a HelloRetryRequest here).
		{"client p-256 first", nil, []tls.CurveID{tls.CurveP256, tls.X25519}, tls.X25519},
		{"none in common", []tls.CurveID{tls.CurveP384}, []tls.CurveID{tls.X25519}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := ServerConfig(store, mustAllow(t, "spiffe://td/worker/*"))
			client := ClientConfig(worker, mustAllow(t, "spiffe://td/store"), "")
			server.CurvePreferences, client.CurvePreferences = tc.server, tc.client
			serverErr, clientErr, saw := handshake(t, server, client)
			if tc.want == 0 {
				if serverErr == nil || clientErr == nil {
					t.Fatalf("connected with no group in common: server %v, client %v", serverErr, clientErr)
				}
				return
			}
			if serverErr != nil || clientErr != nil {
				t.Fatalf("server %v, client %v", serverErr, clientErr)
			}
			if saw.CurveID != tc.want {
				t.Errorf("negotiated %v, want %v", saw.CurveID, tc.want)
			}
		})
	}
}
