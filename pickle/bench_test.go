package pickle

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

func corpusFile(b *testing.B, pattern string) []byte {
	files, _ := filepath.Glob(filepath.Join("testdata/corpus", pattern))
	if len(files) == 0 {
		b.Skipf("no corpus file %s", pattern)
	}
	data, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func benchScan(b *testing.B, data []byte, enc Encoding) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	lim := DefaultLimits()
	for b.Loop() {
		if enc == Base64 {
			ScanBase64(data, nil, lim)
		} else {
			Scan(data, nil, lim)
		}
	}
}

// BenchmarkScan4KiB: a 4 KiB protocol 4 pickle of dataclasses, dicts, sets and datetimes.
func BenchmarkScan4KiB(b *testing.B) { benchScan(b, corpusFile(b, "benign_mix_4k_p4.pkl"), Raw) }

func BenchmarkScan4KiBBase64(b *testing.B) {
	benchScan(b, []byte(base64.StdEncoding.EncodeToString(corpusFile(b, "benign_mix_4k_p4.pkl"))), Base64)
}

// BenchmarkScanRendezvousState: the torchrun state as the newest torch in the corpus stores it.
func BenchmarkScanRendezvousState(b *testing.B) {
	benchScan(b, corpusFile(b, "torch-2.*_rdzv_state_joining_b64.b64"), Base64)
}

// BenchmarkScanBase64NotPickle: 64 MiB of base64 text that is not a pickle costs its first bytes.
func BenchmarkScanBase64NotPickle(b *testing.B) {
	benchScan(b, bytes.Repeat([]byte("QUJD"), 16<<20), Base64)
}

// BenchmarkScanLargeBytes: a 64 MiB bytes value is skipped, not copied; in base64 it is decoded
// through a fixed buffer.
func BenchmarkScanLargeBytes(b *testing.B) {
	p := append([]byte{0x80, 4, 0x8e}, binary.LittleEndian.AppendUint64(nil, 64<<20)...)
	p = append(append(p, make([]byte, 64<<20)...), '.')
	b.Run("raw", func(b *testing.B) { benchScan(b, p, Raw) })
	b.Run("base64", func(b *testing.B) { benchScan(b, []byte(base64.StdEncoding.EncodeToString(p)), Base64) })
}
