package audit

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Vectors from the spec's baseline (corelight/community-id-spec,
// baseline/baseline_deflt.json, proto 6), both directions of each flow.
func TestCommunityID(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		srcPort uint16
		dst     string
		dstPort uint16
		want    string
	}{
		{"ipv4", "128.232.110.120", 34855, "66.35.250.204", 80, "1:LQU9qZlK+B5F3KDmev6m5PMibrg="},
		{"ipv4 reply", "66.35.250.204", 80, "128.232.110.120", 34855, "1:LQU9qZlK+B5F3KDmev6m5PMibrg="},
		{"ipv4-mapped hashes as ipv4", "::ffff:128.232.110.120", 34855, "::ffff:66.35.250.204", 80, "1:LQU9qZlK+B5F3KDmev6m5PMibrg="},
		{"ipv6", "2001:470:e5bf:dead:4957:2174:e82c:4887", 63943, "2607:f8b0:400c:c03::1a", 25, "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4="},
		{"ipv6 reply", "2607:f8b0:400c:c03::1a", 25, "2001:470:e5bf:dead:4957:2174:e82c:4887", 63943, "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4="},
		// Same address both ends: ports decide the order (checked against
		// a Python transcription of the spec's pseudo code).
		{"same ip", "10.0.0.1", 1234, "10.0.0.1", 80, "1:WaobEo3Uyp/JjlL9QX3lvrl1Oag="},
		{"same ip reply", "10.0.0.1", 80, "10.0.0.1", 1234, "1:WaobEo3Uyp/JjlL9QX3lvrl1Oag="},
		{"mixed families", "10.0.0.1", 1, "2001:db8::1", 2, ""},
		{"invalid", "", 1, "10.0.0.1", 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, _ := netip.ParseAddr(tt.src)
			dst, _ := netip.ParseAddr(tt.dst)
			if got := CommunityID(src, tt.srcPort, dst, tt.dstPort); got != tt.want {
				t.Errorf("CommunityID = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestEventJSON(t *testing.T) {
	ts := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		e    Event
		want string
	}{
		{
			name: "violation with zero offset",
			e: Event{
				Timestamp: ts, ID: "abc", Action: ActionBlocked, Reason: "key_too_long",
				SourceIP: netip.MustParseAddr("10.1.2.3"), SourcePort: 40000,
				DestIP: netip.MustParseAddr("10.0.0.1"), DestPort: 29500,
				CommunityID: "1:x", ConnID: 7, Generation: "G3", Op: "SET", Field: "key",
				Offset: new(uint64(0)), MessageIndex: new(uint64(0)), Declared: new(BigUint(1 << 40)),
				Limit: new(BigUint(8192)), FirstBytes: HexBytes{0x00, 0xab}, BytesSeen: new(uint64(9)),
				Mode: ModeEnforce,
			},
			want: `{"@timestamp":"2025-03-01T12:00:00.123456789Z","event.id":"abc","event.action":"blocked",` +
				`"event.reason":"key_too_long","source.ip":"10.1.2.3","source.port":40000,` +
				`"destination.ip":"10.0.0.1","destination.port":29500,"network.community_id":"1:x",` +
				`"storeguard.conn_id":7,"storeguard.generation":"G3","storeguard.op":"SET","storeguard.field":"key",` +
				`"storeguard.offset":0,"storeguard.message_index":0,"storeguard.declared":"1099511627776",` +
				`"storeguard.limit":"8192","storeguard.first_bytes":"00ab","storeguard.bytes_seen":9,"storeguard.mode":"enforce"}`,
		},
		{
			name: "absent fields omitted",
			e:    Event{Timestamp: ts, ID: "s", Action: ActionSampledSummary, SourceIP: netip.MustParseAddr("2001:db8::1"), Suppressed: 42},
			want: `{"@timestamp":"2025-03-01T12:00:00.123456789Z","event.id":"s","event.action":"sampled_summary",` +
				`"source.ip":"2001:db8::1","storeguard.suppressed":42}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.e)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("got  %s\nwant %s", b, tt.want)
			}
			var back Event
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.e) {
				t.Errorf("round trip: got %+v, want %+v", back, tt.e)
			}
		})
	}
}

func TestEventIDsUnique(t *testing.T) {
	seen := make(map[string]bool)
	for range 10000 {
		id := newEventID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("id %q is not 32 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

// TestBigUintReadsBoth: declared and limit are written as strings and read from strings or from
// the numbers older logs have.
func TestBigUintReadsBoth(t *testing.T) {
	for _, in := range []string{`{"storeguard.declared":"9309061931890442240"}`, `{"storeguard.declared":9309061931890442240}`} {
		var e Event
		if err := json.Unmarshal([]byte(in), &e); err != nil || e.Declared == nil || *e.Declared != 9309061931890442240 {
			t.Errorf("%s: %v, %v", in, e.Declared, err)
		}
	}
	var e Event
	if err := json.Unmarshal([]byte(`{"storeguard.declared":"-1"}`), &e); err == nil {
		t.Error("a negative declared length was read")
	}
}
