package audit

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func gzipBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const goodLine = `{"@timestamp":"2025-03-01T12:00:00Z","event.id":"x","event.action":"blocked","source.ip":"192.0.2.1"}`

func TestEventsMalformed(t *testing.T) {
	log := strings.Join([]string{
		goodLine,                                // 1
		"not json",                              // 2
		"",                                      // 3: blank, skipped silently
		`{"@timestamp":"2025-03-01T12:00:00Z"}`, // 4: no action
		`{"event.action":"blocked"}`,            // 5: no timestamp
		`{"@timestamp":"2025-03-01T12:00:00Z","event.action":"blocked","storeguard.first_bytes":"zz"}`, // 6: bad hex
		`{"@timestamp":"2025-03-01T12:00:00Z","event.action":"blocked","source.ip":"nope"}`,            // 7: bad ip
		"   \r", // 8: blank
		`{"@timestamp":"2025-03-01T12:00:00Z",` + strings.Repeat(" ", MaxLineBytes) + `"event.action":"blocked","source.ip":"192.0.2.1"}`, // 9: valid but too long
		goodLine + "\r", // 10: CRLF is fine
		goodLine,        // 11: no final newline
	}, "\n")
	tests := []struct {
		name string
		data []byte
	}{
		{"plain", []byte(log)},
		{"gzip", gzipBytes(t, []byte(log))},
		{"gzip multistream", append(gzipBytes(t, []byte(log[:len(goodLine)+1])), gzipBytes(t, []byte(log[len(goodLine)+1:]))...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var good int
			var badLines []int
			for e, err := range Events(bytes.NewReader(tt.data)) {
				var le *LineError
				switch {
				case errors.As(err, &le):
					badLines = append(badLines, le.Line)
					if le.Line == 9 && !errors.Is(err, errLineTooLong) {
						t.Errorf("line 9: %v, want errLineTooLong", err)
					}
				case err != nil:
					t.Fatalf("error %v is not a *LineError", err)
				case e.SourceIP != ip("192.0.2.1"):
					t.Errorf("event %+v", e)
				default:
					good++
				}
			}
			// A multistream gzip counts lines across members as one file.
			if want := []int{2, 4, 5, 6, 7, 9}; !slices.Equal(badLines, want) {
				t.Errorf("malformed lines %v, want %v", badLines, want)
			}
			if good != 3 {
				t.Errorf("%d good events, want 3", good)
			}
		})
	}
}

func TestEventsTruncatedGzip(t *testing.T) {
	full := gzipBytes(t, []byte(strings.Repeat(goodLine+"\n", 1000)))
	var good int
	var last error
	for _, err := range Events(bytes.NewReader(full[:len(full)-20])) {
		if err != nil {
			last = err
			continue
		}
		good++
	}
	var le *LineError
	if !errors.As(last, &le) || !errors.Is(last, io.ErrUnexpectedEOF) {
		t.Fatalf("last error %v, want a *LineError wrapping io.ErrUnexpectedEOF", last)
	}
	if good == 0 || good >= 1000 || le.Line != good+1 {
		t.Errorf("%d good events, error at line %d", good, le.Line)
	}
}

func TestEventsStopEarly(t *testing.T) {
	n := 0
	for range Events(strings.NewReader(strings.Repeat(goodLine+"\n", 10))) {
		n++
		if n == 3 {
			break
		}
	}
	if n != 3 {
		t.Errorf("iterated %d times", n)
	}
}

func TestRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a[1].log") // glob metacharacters in the name
	for _, name := range []string{"", ".1.gz", ".2", ".10", ".x", ".0", ".1.bak", "x"} {
		if err := os.WriteFile(path+name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := RotatedFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{path + ".10", path + ".2", path + ".1.gz", path}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	if got, _ := RotatedFiles(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("missing file: got %v", got)
	}
}
