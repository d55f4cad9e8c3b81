package identity

import (
	"crypto/tls"
	"fmt"
	"strings"
)

// groups are the key exchange groups tls.key-exchange may name, by the names OpenSSL, stunnel's
// curves and HAProxy's curves use (lower case).
var groups = []struct {
	name string
	id   tls.CurveID
}{
	{"x25519mlkem768", tls.X25519MLKEM768},
	{"secp256r1mlkem768", tls.SecP256r1MLKEM768},
	{"secp384r1mlkem1024", tls.SecP384r1MLKEM1024},
	{"x25519", tls.X25519},
	{"p-256", tls.CurveP256},
	{"p-384", tls.CurveP384},
	{"p-521", tls.CurveP521},
}

// ParseGroups reads the key exchange groups a handshake may use, most preferred first (the
// client offers a key share for the first): nil for none named, which leaves crypto/tls's own
// (X25519MLKEM768 first, a post-quantum hybrid; then X25519 and the NIST curves). Names are
// case-insensitive; secp256r1, prime256v1 and the like are the NIST curves' other names.
func ParseGroups(names []string) ([]tls.CurveID, error) {
	var ids []tls.CurveID
	for _, n := range names {
		id, ok := groupOf(strings.ToLower(strings.TrimSpace(n)))
		if !ok {
			known := make([]string, len(groups))
			for i, g := range groups {
				known[i] = g.name
			}
			return nil, fmt.Errorf("unknown key exchange group %q (want one of %s)", n, strings.Join(known, ", "))
		}
		for _, have := range ids {
			if have == id {
				return nil, fmt.Errorf("key exchange group %q named twice", n)
			}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func groupOf(name string) (tls.CurveID, bool) {
	switch name {
	case "secp256r1", "prime256v1", "p256":
		name = "p-256"
	case "secp384r1", "p384":
		name = "p-384"
	case "secp521r1", "p521":
		name = "p-521"
	}
	for _, g := range groups {
		if g.name == name {
			return g.id, true
		}
	}
	return 0, false
}
