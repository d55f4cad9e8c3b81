package pickle

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
)

// TestBase64Differential decodes the inputs of testdata/base64_cases.json (written by
// gen_base64.py from Python's base64.b64decode) split into two buffers at every point, and
// expects Python's answer: the same bytes, or an error where Python raises.
func TestBase64Differential(t *testing.T) {
	raw, err := os.ReadFile("testdata/base64_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Python string
		Cases  []struct {
			In, Out string
			OK      bool
		}
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	for _, c := range file.Cases {
		in, _ := hex.DecodeString(c.In)
		want, _ := hex.DecodeString(c.Out)
		for k := 0; k <= len(in); k++ {
			if len(in) > 64 && k != 0 && k != len(in)/2+1 && k != len(in) {
				continue
			}
			got, ok := decodeBase64(in[:k], in[k:])
			if ok != c.OK || (ok && !bytes.Equal(got, want)) {
				t.Fatalf("b64decode(%q) split at %d = %x, %v; Python %s: %x, %v", in, k, got, ok, file.Python, want, c.OK)
			}
		}
	}
	t.Logf("%d cases from Python %s", len(file.Cases), file.Python)
}

// TestBase64Streaming decodes into buffers of every small size: the quad fast path and the
// character path must produce the same stream, and a clean text's bytes must be found again by
// offset (bytesAt).
func TestBase64Streaming(t *testing.T) {
	data := make([]byte, 700)
	for i := range data {
		data[i] = byte(i*7 + i/13)
	}
	for _, text := range [][]byte{
		[]byte(base64.StdEncoding.EncodeToString(data)),
		[]byte(base64.StdEncoding.EncodeToString(data[:698])),
		[]byte(base64.StdEncoding.EncodeToString(data[:697])),
		[]byte("  " + base64.StdEncoding.EncodeToString(data[:100]) + "\n"),
	} {
		want, ok := decodeBase64(text, nil)
		if !ok {
			t.Fatalf("%q does not decode", text)
		}
		for size := 1; size <= 9; size++ {
			var d b64dec
			d.init(text[:len(text)/3], text[len(text)/3:])
			var got []byte
			buf := make([]byte, size)
			for {
				n := d.decode(buf)
				if n == 0 {
					break
				}
				got = append(got, buf[:n]...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("decode with %d-byte buffers differs", size)
			}
			if d.clean < 0 {
				for off := 0; off+5 <= len(want); off += 37 {
					p := make([]byte, 5)
					bytesAt(text[:len(text)/3], text[len(text)/3:], off, p)
					if !bytes.Equal(p, want[off:off+5]) {
						t.Fatalf("bytesAt(%d) = %x, want %x", off, p, want[off:off+5])
					}
				}
			}
		}
	}
}

// TestScanBase64Validity: b64decode raising makes pickle.loads never run, even when the bad
// padding comes after a pickle the scan read in full.
func TestScanBase64Validity(t *testing.T) {
	p := []byte("cos\nsystem\n(S'id'\ntR.")
	text := base64.StdEncoding.EncodeToString(p)
	for _, c := range []struct {
		name string
		text string
		ok   bool
	}{
		{"plain", text, true},
		{"junk between", "!" + text[:5] + "\n" + text[5:] + "\n", true},
		{"one char too many", text + "A", false},
		{"incorrect padding", text + "AB", false},
		{"padding then anything", text + "AB==" + "@@@", true},
		{"data after padding", text + "QQ==" + "not base64 at all", true},
	} {
		r, ok := ScanBase64([]byte(c.text), nil, DefaultLimits())
		if ok != c.ok {
			t.Errorf("%s: ok = %v, want %v", c.name, ok, c.ok)
			continue
		}
		if !ok {
			if r.Encoding != Raw || r.Complete || len(r.Globals) != 0 {
				t.Errorf("%s: report not zero: %+v", c.name, r)
			}
			continue
		}
		if !r.Complete || len(r.Globals) != 1 || r.Globals[0].Name != "system" {
			t.Errorf("%s: %+v", c.name, r)
		}
	}
	// Not a pickle, not valid base64: nothing could run, the scan stops after a few bytes and does
	// not read on to see whether the text decodes.
	r, ok := ScanBase64([]byte("Zm9vYmFy-not-a-pickle-and-bad-padding-A"), nil, DefaultLimits())
	if !ok || r.Complete || r.Err == nil || r.End > 8 {
		t.Errorf("non-pickle: ok %v, %+v", ok, r)
	}
}
