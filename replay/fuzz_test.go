package replay

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/storeguard/storeguard/config"
)

// FuzzReadCapture: any bytes as a capture file give results or a clear error, never a panic,
// and every stream result has a verdict.
func FuzzReadCapture(f *testing.F) {
	paths, _ := filepath.Glob("testdata/pcap/*.pcapng")
	for _, p := range paths[:min(1, len(paths))] {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add([]byte("\xd4\xc3\xb2\xa1garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := config.Default()
		var results []StreamResult
		r, err := New(cfg, Options{Ports: []uint16{29500}, OnStream: func(s StreamResult) error {
			results = append(results, s)
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		r.ReadCapture(context.Background(), "fuzz", bytes.NewReader(data))
		r.Close()
		for _, s := range results {
			if s.Verdict == "" {
				t.Fatalf("a stream without a verdict: %+v", s)
			}
		}
	})
}
