package config

import (
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// decodeHook is viper's decode hook: it parses the text of one setting into
// its field's type. Every layer holds text (file scalars as written, env,
// flags), and a list may also be one comma-separated string (env, flags).
// The parsers are ours rather than mapstructure's weak typing and stock hooks
// because errors must say what is wrong in a user's terms (`"30" is not a
// duration; add a unit, such as 30s`), bools are true or false only, a CIDR
// may be a bare address, and log.level is one of four names.
func decodeHook(_, to reflect.Type, data any) (any, error) {
	if to.Kind() == reflect.Slice {
		return listItems(data), nil
	}
	s, ok := data.(string)
	if !ok {
		return data, nil
	}
	if parse := parsers[to]; parse != nil {
		return parse(s)
	}
	return s, nil
}

// parsers turn a setting's text into a field of the type they are listed
// under. Strings need none.
var parsers = map[reflect.Type]func(string) (any, error){
	reflect.TypeFor[int64]():         parseInt64,
	reflect.TypeFor[ByteLimit]():     parseByteLimit,
	reflect.TypeFor[int]():           parseInt,
	reflect.TypeFor[float64]():       parseFloat,
	reflect.TypeFor[bool]():          parseBool,
	reflect.TypeFor[time.Duration](): parseDuration,
	reflect.TypeFor[slog.Level]():    parseLevel,
	reflect.TypeFor[netip.Prefix]():  parsePrefix,
	reflect.TypeFor[uint16]():        parsePort, // replay.ports is the only uint16
	reflect.TypeFor[Backend]():       parseName[Backend],
	reflect.TypeFor[Mode]():          parseName[Mode],
	reflect.TypeFor[LogFormat]():     parseName[LogFormat],
	reflect.TypeFor[AutoCount]():     parseAutoCount,
	reflect.TypeFor[AutoRate]():      parseAutoRate,
}

// listItems returns a list setting's items: "a, b" is two, "" none. An empty
// list is nil, as in Default.
func listItems(data any) any {
	switch d := data.(type) {
	case string:
		var items []string
		for _, f := range strings.Split(d, ",") {
			if f = strings.TrimSpace(f); f != "" {
				items = append(items, f)
			}
		}
		return items
	case []any:
		if len(d) == 0 {
			return []any(nil)
		}
	}
	return data
}

func parseInt64(s string) (any, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%q is not an integer", s)
	}
	return n, nil
}

// parseByteLimit reads auto or a number of bytes. 0 is refused here: it would read as auto.
func parseByteLimit(s string) (any, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "auto") {
		return AutoLimit, nil
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%q is neither auto nor a number of bytes", s)
	}
	if n < 1 {
		return nil, fmt.Errorf("must be auto or a number of bytes of at least 1, got %d", n)
	}
	return ByteLimit(n), nil
}

func parseInt(s string) (any, error) {
	n, err := parseInt64(s)
	if err != nil {
		return nil, err
	}
	if i := n.(int64); i < math.MinInt32 || i > math.MaxInt32 {
		return nil, fmt.Errorf("%d is far too large", i)
	}
	return int(n.(int64)), nil
}

// parseAutoCount reads "auto" or an integer.
func parseAutoCount(s string) (any, error) {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		return AutoCount{Auto: true}, nil
	}
	n, err := parseInt(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not auto or an integer", s)
	}
	return AutoCount{N: n.(int)}, nil
}

func parseAutoRate(s string) (any, error) {
	if strings.EqualFold(strings.TrimSpace(s), "auto") {
		return AutoRate{Auto: true}, nil
	}
	f, err := parseFloat(s)
	if err != nil {
		return nil, fmt.Errorf("%q is not auto or a number", s)
	}
	return AutoRate{Rate: f.(float64)}, nil
}

func parseFloat(s string) (any, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("%q is not a number", s)
	}
	return f, nil
}

func parseBool(s string) (any, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return nil, fmt.Errorf("%q is not true or false", s)
}

func parseDuration(s string) (any, error) {
	t := strings.TrimSpace(s)
	d, err := time.ParseDuration(t)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(t, 64); nerr == nil {
		return nil, fmt.Errorf("%q is not a duration; add a unit, such as %ss", s, t)
	}
	return nil, fmt.Errorf("%q is not a duration (such as 500ms, 30s, 10m, 2h)", s)
}

// parseLevel accepts the four names only: slog.Level's own UnmarshalText
// would also take offsets such as "INFO+2", which YAML() cannot write back.
func parseLevel(s string) (any, error) {
	for _, ll := range logLevels {
		if strings.EqualFold(strings.TrimSpace(s), ll.name) {
			return ll.level, nil
		}
	}
	return nil, fmt.Errorf("%q is not one of debug, info, warn, error", s)
}

// parsePrefix reads a CIDR; a bare address is a one-address prefix.
func parsePrefix(s string) (any, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return nil, fmt.Errorf("%q is not a CIDR", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func parsePort(s string) (any, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("%q is not a port (1 to 65535)", s)
	}
	return uint16(n), nil
}

// parseName reads an enum in any case; validate checks it is one of the names.
func parseName[T ~string](s string) (any, error) {
	return T(strings.ToLower(strings.TrimSpace(s))), nil
}
