package replay

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/storeguard/storeguard/config"
	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

// benchCapture is a pcap file of torch-like traffic, made once per test binary: the capture
// bench/replay-vs-tshark.sh times, smaller (REPLAY_BENCH_MB, default 64 MiB).
var benchCapture struct {
	once    sync.Once
	path    string
	bytes   int64
	packets int64
	err     error
}

func benchFile(b *testing.B) (path string, size, packets int64) {
	bc := &benchCapture
	bc.once.Do(func() {
		mb := int64(64)
		if v, err := strconv.ParseInt(os.Getenv("REPLAY_BENCH_MB"), 10, 64); err == nil && v > 0 {
			mb = v
		}
		dir, err := os.MkdirTemp("", "replay-bench")
		if err != nil {
			bc.err = err
			return
		}
		bc.path = filepath.Join(dir, "capture.pcap")
		f, err := os.Create(bc.path)
		if err != nil {
			bc.err = err
			return
		}
		defer f.Close()
		bw := bufio.NewWriterSize(f, 1<<20)
		w, err := gencap.NewWriter(bw, gencap.Pcap, gencap.Ethernet)
		if err == nil {
			err = gencap.Traffic(w, gencap.TrafficOptions{Target: mb << 20, Clients: 256, Gen: protocol.G3, Seed: 1})
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			bc.err = err
			return
		}
		fi, err := f.Stat()
		if err != nil {
			bc.err = err
			return
		}
		bc.bytes, bc.packets = fi.Size(), w.Packets
	})
	if bc.err != nil {
		b.Fatal(bc.err)
	}
	return bc.path, bc.bytes, bc.packets
}

// BenchmarkReplayFile replays a generated capture file (see benchFile) and, to show what the
// replay's cost is made of, runs the parts alone: pcapgo reading the file, then that and
// gopacket decoding each packet's layers. Each reports MB/s of the file and packets/s.
//
//	go test -run '^$' -bench ReplayFile ./replay/
func BenchmarkReplayFile(b *testing.B) {
	path, size, packets := benchFile(b)
	each := func(b *testing.B, fn func() error) {
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			if err := fn(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(packets)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
	}
	readAll := func(decode bool) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		src, err := openSource(f)
		if err != nil {
			return err
		}
		pd := newPacketDecoder()
		for {
			data, _, lt, err := src.next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if decode {
				pd.decode(data, lt)
			}
		}
	}
	b.Run("pcapgo-read", func(b *testing.B) { each(b, func() error { return readAll(false) }) })
	b.Run("pcapgo-read+decode", func(b *testing.B) { each(b, func() error { return readAll(true) }) })
	b.Run("replay", func(b *testing.B) {
		each(b, func() error {
			r, err := New(config.Default(), Options{})
			if err != nil {
				return err
			}
			if err := r.ReadFile(context.Background(), path); err != nil {
				return err
			}
			if s := r.Summary(); s.Pass != s.Streams || s.Packets != uint64(packets) {
				b.Fatalf("summary %+v", s)
			}
			return nil
		})
	})
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchCapture.path != "" {
		os.RemoveAll(filepath.Dir(benchCapture.path))
	}
	os.Exit(code)
}
