package storeinfo

import (
	"net"
	"slices"
	"strconv"
	"testing"
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
