package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/storeguard/storeguard/audit/report"
)

// TestAuditCommand drives `storeguard audit` over a log with one rotated
// backup: the flags reach the filter, the rotated backup is read unless
// --rotated=false, and a bad flag value is named.
func TestAuditCommand(t *testing.T) {
	dir := t.TempDir()
	line := func(ts, reason, ip string) string {
		return `{"@timestamp":"` + ts + `","event.id":"x","event.action":"blocked","event.reason":"` + reason + `","source.ip":"` + ip + `"}` + "\n"
	}
	log := filepath.Join(dir, "audit.log")
	os.WriteFile(log+".1", []byte(line("2025-03-01T12:00:00Z", "key_too_long", "192.0.2.1")+
		line("2025-03-01T12:01:00Z", "key_too_long", "192.0.2.1")), 0o600)
	os.WriteFile(log, []byte(line("2025-03-01T13:00:00Z", "value_too_long", "192.0.2.2")+
		line("2025-03-01T13:01:00Z", "key_too_long", "198.51.100.9")), 0o600)

	tests := []struct {
		name    string
		args    []string
		files   int
		events  uint64
		wantErr string
	}{
		{name: "all", args: nil, files: 2, events: 4},
		{name: "duplicates read once", args: []string{log + ".1"}, files: 2, events: 4},
		{name: "not rotated", args: []string{"--rotated=false"}, files: 1, events: 2},
		{name: "plain ip", args: []string{"--source", "192.0.2.1"}, files: 2, events: 2},
		{name: "IPv4-mapped ip", args: []string{"--source", "::ffff:198.51.100.9"}, files: 2, events: 1},
		{name: "cidr and rule", args: []string{"--source", "192.0.2.0/24", "--rule", "value_too_long"}, files: 2, events: 1},
		{name: "since rfc3339", args: []string{"--since", "2025-03-01T13:00:00Z"}, files: 2, events: 2},
		{name: "until date", args: []string{"--until", "2025-03-02"}, files: 2, events: 4},
		{name: "until date excludes", args: []string{"--until", "2025-03-01"}, files: 2, events: 0},
		{name: "since duration ago", args: []string{"--since", "1h"}, files: 2, events: 0}, // the log is from 2025
		{name: "bad format", args: []string{"--format", "xml"}, wantErr: "--format"},
		{name: "bad source", args: []string{"--source", "10.0.0.0/99"}, wantErr: "--source"},
		{name: "bad since", args: []string{"--since", "yesterday"}, wantErr: "--since"},
		{name: "bad until", args: []string{"--until", "tomorrow"}, wantErr: "--until"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"audit", "--format", "json", log}, tt.args...)
			status := run(args, &out, &errOut)
			if tt.wantErr != "" {
				if status != 2 || !strings.Contains(errOut.String(), tt.wantErr) {
					t.Fatalf("status %d, stderr %q; want 2 and an error about %s", status, errOut.String(), tt.wantErr)
				}
				return
			}
			if status != 0 {
				t.Fatalf("status %d: %s", status, errOut.String())
			}
			var s report.Summary
			if err := json.Unmarshal(out.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			if s.Files != tt.files || s.Events != tt.events {
				t.Errorf("files %d events %d, want %d %d", s.Files, s.Events, tt.files, tt.events)
			}
		})
	}

	var out, errOut bytes.Buffer
	if status := run([]string{"audit", "--top", "1", log}, &out, &errOut); status != 0 || !strings.Contains(out.String(), "192.0.2.1") || strings.Contains(out.String(), "192.0.2.2") {
		t.Errorf("--top 1 table: status %d, stdout %q", status, out.String())
	}
	if status := run([]string{"audit", filepath.Join(dir, "missing.log")}, &out, &errOut); status != 2 {
		t.Errorf("a missing file: status %d, want 2", status)
	}
	if status := run([]string{"audit"}, &out, &errOut); status != 2 {
		t.Errorf("no FILE: status %d, want 2", status)
	}
}

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"":                       {},
		"24h":                    now.Add(-24 * time.Hour),
		"2025-03-01T13:00:00.5Z": time.Date(2025, 3, 1, 13, 0, 0, 5e8, time.UTC),
		"2025-03-02":             time.Date(2025, 3, 2, 0, 0, 0, 0, time.UTC),
	} {
		if got, err := parseTime(s, now); err != nil || !got.Equal(want) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := parseTime("yesterday", now); err == nil {
		t.Error("parseTime(yesterday) succeeded")
	}
}

func TestParseSource(t *testing.T) {
	for s, want := range map[string]netip.Prefix{
		"":                 {},
		"192.0.2.1":        netip.MustParsePrefix("192.0.2.1/32"),
		"::ffff:192.0.2.1": netip.MustParsePrefix("192.0.2.1/32"),
		"2001:db8::5":      netip.MustParsePrefix("2001:db8::5/128"),
		"192.0.2.77/24":    netip.MustParsePrefix("192.0.2.0/24"),
	} {
		if got, err := parseSource(s); err != nil || got != want {
			t.Errorf("parseSource(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := parseSource("10.0.0.0/99"); err == nil {
		t.Error("parseSource(10.0.0.0/99) succeeded")
	}
}
