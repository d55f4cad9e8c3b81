// Package protocol decodes and encodes the client-to-server byte stream of PyTorch's TCPStore.
//
// It knows bytes and nothing about sockets: a Decoder is fed the stream in chunks of any size and
// reports complete messages and the first violation of the configured Limits. Every length and
// count is checked the moment its bytes arrive, before anything is sized from it.
package protocol

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Op is an operation independent of its wire value, which differs between generations.
type Op uint8

const (
	OpInvalid Op = iota
	OpValidate
	OpSet
	OpCompareSet
	OpGet
	OpAdd
	OpCheck
	OpWait
	OpGetNumKeys
	OpWatchKey
	OpDeleteKey
	OpAppend
	OpMultiGet
	OpMultiSet
	OpCancelWait
	OpPing
	OpQueuePush
	OpQueuePop
	OpQueueLen
	OpListKeys
	OpBarrier
	numOps
)

var opNames = [numOps]string{
	"invalid", "validate", "set", "compare_set", "get", "add", "check", "wait", "get_num_keys",
	"watch_key", "delete_key", "append", "multi_get", "multi_set", "cancel_wait", "ping",
	"queue_push", "queue_pop", "queue_len", "list_keys", "barrier",
}

func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Ops lists every known operation, for metrics that pre-register one series per op.
func Ops() []Op {
	ops := make([]Op, 0, numOps-1)
	for o := OpValidate; o < numOps; o++ {
		ops = append(ops, o)
	}
	return ops
}

// Generation is a numbering of the wire protocol; see docs/protocol.md.
type Generation uint8

const (
	G0 Generation = iota // torch <= 2.0: no handshake, WATCH_KEY, a silent callback connection
	G1                   // 2.1: WATCH_KEY gone, APPEND/MULTI_GET/MULTI_SET/CANCEL_WAIT
	G2                   // VALIDATE first; every opcode shifted up by one
	G3                   // PING after VALIDATE
	G4                   // QUEUE_PUSH/POP/LEN (libuv only)
	G5                   // LIST_KEYS
	G6                   // BARRIER
	numGenerations
)

// LatestGeneration is the newest generation this decoder knows.
const LatestGeneration = numGenerations - 1

func (g Generation) String() string { return "G" + strconv.Itoa(int(g)) }

// Validated reports whether connections of this generation start with VALIDATE.
func (g Generation) Validated() bool { return g >= G2 }

// Backend is the TCPStore server implementation behind the guard.
type Backend uint8

const (
	BackendAny    Backend = iota // unknown: allow what either backend accepts
	BackendLegacy                // TCPStoreMasterDaemon: poll loop, blocking reads
	BackendLibuv                 // LibUVStoreDaemon
)

func (b Backend) String() string {
	switch b {
	case BackendLegacy:
		return "legacy"
	case BackendLibuv:
		return "libuv"
	}
	return "auto"
}

// ParseBackend accepts auto, legacy or libuv.
func ParseBackend(s string) (Backend, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto", "":
		return BackendAny, nil
	case "legacy":
		return BackendLegacy, nil
	case "libuv":
		return BackendLibuv, nil
	}
	return 0, fmt.Errorf("%q is not a backend (want auto, legacy or libuv)", s)
}

// GenSetting is the configured generation: Auto, or one fixed generation.
type GenSetting struct {
	Auto bool
	Gen  Generation // when !Auto
}

func (s GenSetting) String() string {
	if s.Auto {
		return "auto"
	}
	return s.Gen.String()
}

// releaseGenerations maps torch MAJOR.MINOR releases to generations, as observed on real torch
// (docs/protocol.md). Releases newer than the last entry speak its generation.
var releaseGenerations = []struct {
	major, minor int
	gen          Generation
}{
	{1, 13, G0}, {2, 0, G0}, {2, 1, G1}, {2, 2, G2}, {2, 5, G3}, {2, 8, G4}, {2, 10, G5}, {2, 12, G6},
}

// GenerationOfRelease returns the generation a torch release speaks.
func GenerationOfRelease(major, minor int) (Generation, error) {
	first := releaseGenerations[0]
	if major < first.major || (major == first.major && minor < first.minor) {
		return 0, fmt.Errorf("torch %d.%d is older than 1.13, the oldest release storeguard knows", major, minor)
	}
	if major > 2 {
		return 0, fmt.Errorf("torch %d.%d is not a release storeguard knows", major, minor)
	}
	gen := first.gen
	for _, r := range releaseGenerations {
		if major > r.major || (major == r.major && minor >= r.minor) {
			gen = r.gen
		}
	}
	return gen, nil
}

// ParseGeneration accepts "auto", a generation name ("G0".."G6") or a torch release
// "MAJOR.MINOR" (a patch level, "2.6.0", is accepted and ignored). Releases newer than the newest
// one this decoder knows are read as its generation.
func ParseGeneration(s string) (GenSetting, error) {
	if strings.EqualFold(s, "auto") {
		return GenSetting{Auto: true}, nil
	}
	if len(s) == 2 && (s[0] == 'G' || s[0] == 'g') {
		if n := int(s[1] - '0'); n >= 0 && n < int(numGenerations) {
			return GenSetting{Gen: Generation(n)}, nil
		}
	}
	m := releaseRE.FindStringSubmatch(s)
	if m == nil {
		return GenSetting{}, fmt.Errorf("%q is not a generation (want auto, G0..%s or a torch release MAJOR.MINOR such as 2.6)", s, LatestGeneration)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	g, err := GenerationOfRelease(major, minor)
	if err != nil {
		return GenSetting{}, err
	}
	return GenSetting{Gen: g}, nil
}

// releaseRE matches MAJOR.MINOR[.PATCH] without leading zeros, minor below 100.
var releaseRE = regexp.MustCompile(`^(0|[1-9][0-9]?)\.(0|[1-9][0-9]?)(?:\.(?:0|[1-9][0-9]*))?$`)
