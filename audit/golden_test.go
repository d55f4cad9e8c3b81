package audit_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// eventID matches the random event.id the writer gives every line.
var eventID = regexp.MustCompile(`"event\.id":"[0-9a-f]{32}"`)

// TestEventLinesGolden: every kind of event, as the writer writes it for serve (everyKind), is
// byte for byte what testdata/events.golden.jsonl holds, but for its random event.id. A field added
// to Event must leave the lines of events that do not set it as they were. Rewrite with:
// go test ./audit/ -run EventLinesGolden -update
func TestEventLinesGolden(t *testing.T) {
	var got bytes.Buffer
	for _, d := range everyKind(t, observers[1].o) {
		got.Write(eventID.ReplaceAll(d.line, []byte(`"event.id":"-"`)))
		got.WriteByte('\n')
	}
	path := filepath.Join("testdata", "events.golden.jsonl")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("lines differ from %s:\n got: %s\nwant: %s", path, got.Bytes(), want)
	}
}
