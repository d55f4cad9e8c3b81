package proxy

import (
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/protocol"
)

func TestListeningOnFindsWildcardBindsOnly(t *testing.T) {
	wild, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer wild.Close()
	port := wild.Addr().(*net.TCPAddr).Port
	if got := listeningOn(port); !slices.Contains(got, "0.0.0.0:"+strconv.Itoa(port)) {
		t.Errorf("a 0.0.0.0 listener was not reported: %v", got)
	}
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	if got := listeningOn(lo.Addr().(*net.TCPAddr).Port); len(got) != 0 {
		t.Errorf("a loopback listener was reported: %v", got)
	}
}

func TestProcIP(t *testing.T) {
	if ip := procIP("0100007F"); ip.String() != "127.0.0.1" {
		t.Errorf("v4: %v", ip)
	}
	if ip := procIP("00000000000000000000000001000000"); ip.String() != "::1" {
		t.Errorf("v6: %v", ip)
	}
	if procIP("zz") != nil {
		t.Error("garbage parsed")
	}
}

// TestProbeLegacyGeneration: a store that answers CANCEL_WAIT with 01 is G1; one that closes is G0.
func TestProbeLegacyGeneration(t *testing.T) {
	for _, c := range []struct {
		answer []byte
		want   protocol.Generation
	}{{[]byte{0x01}, protocol.G1}, {nil, protocol.G0}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			b := make([]byte, 1)
			conn.Read(b)
			if b[0] == 0x0B && c.answer != nil {
				conn.Write(c.answer)
				time.Sleep(100 * time.Millisecond)
			}
			conn.Close()
		}()
		g, err := ProbeLegacyGeneration(ln.Addr().String(), time.Second)
		ln.Close()
		if err != nil || g != c.want {
			t.Errorf("answer %x: %s %v, want %s", c.answer, g, err, c.want)
		}
	}
	if _, err := ProbeLegacyGeneration("127.0.0.1:1", 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("unreachable store: %v", err)
	}
}
