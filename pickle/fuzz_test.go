package pickle

import (
	"encoding/base64"
	"reflect"
	"testing"
)

// splits are the points FuzzScan cuts an input at: all of them for a short input, a few for a
// long one.
func splits(n int) []int {
	if n <= 64 {
		ks := make([]int, n+1)
		for i := range ks {
			ks[i] = i
		}
		return ks
	}
	return []int{0, 1, n / 3, n / 2, n - 1, n}
}

// FuzzScan: a scan never panics and never reads past its input; cutting the input into two
// buffers anywhere changes nothing; the base64 form of a pickle scans as the pickle does; and the
// input taken as base64 text is decoded as Python's b64decode decodes it. Seeds: every known
// attack and real pickle of testdata/corpus (testdata/fuzz/FuzzScan, written by gen_corpus.py),
// and the table cases.
func FuzzScan(f *testing.F) {
	for _, c := range scanCases {
		f.Add([]byte(c.pickle))
	}
	lim := Limits{MaxOps: 1 << 14, MaxStack: 1 << 10, MaxMemo: 1 << 10, MaxGlobals: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := Scan(data, nil, lim)
		if r.End > len(data) || r.End < 0 {
			t.Fatalf("End %d, input %d bytes", r.End, len(data))
		}
		if r.Complete == (r.Err != nil) {
			t.Fatalf("Complete %v with Err %v", r.Complete, r.Err)
		}
		for _, k := range splits(len(data)) {
			if rk := Scan(data[:k], data[k:], lim); !reflect.DeepEqual(rk, r) {
				t.Fatalf("split at %d: %+v\nwhole: %+v", k, rk, r)
			}
		}
		text := []byte(base64.StdEncoding.EncodeToString(data))
		for _, k := range []int{0, len(text) / 2, len(text)} {
			rb, ok := ScanBase64(text[:k], text[k:], lim)
			rb.Encoding = Raw
			if !ok || !reflect.DeepEqual(rb, r) {
				t.Fatalf("base64 split at %d (ok %v): %+v\nraw: %+v", k, ok, rb, r)
			}
		}

		// The input as base64 text.
		dec, decOK := decodeBase64(data, nil)
		rt, ok := ScanBase64(data, nil, lim)
		switch {
		case ok && !decOK && !nothingRan(rt):
			t.Fatalf("b64decode raises, ScanBase64 ok: %+v", rt)
		case !ok && decOK:
			t.Fatalf("b64decode returns %x, ScanBase64 not ok", dec)
		case ok && decOK:
			if rt.End > len(dec) {
				t.Fatalf("base64 End %d, decoded %d bytes", rt.End, len(dec))
			}
			rt.Encoding = Raw
			if want := Scan(dec, nil, lim); !reflect.DeepEqual(rt, want) {
				t.Fatalf("ScanBase64 %+v\nScan of the decoded bytes %+v", rt, want)
			}
		}
		whole, _ := ScanBase64(data, nil, lim)
		for _, k := range splits(len(data)) {
			rk, okk := ScanBase64(data[:k], data[k:], lim)
			if okk != ok || !reflect.DeepEqual(rk, whole) {
				t.Fatalf("base64 text split at %d: ok %v %+v\nwhole: ok %v %+v", k, okk, rk, ok, whole)
			}
		}
	})
}
