package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// The globals a pickle may import on any key, and call: what builds the data torch and the
// frameworks write to a store, and nothing else. Measured, not guessed (interop/pickle_census.py
// written, every pinned release, every pickle protocol): torchrun's rendezvous state, tensors of every
// dtype and their storages, torch.Size, dtypes and devices, vLLM's PyNcclPipe metadata and its
// ncclUniqueId (a ctypes structure), and the containers and scalars a StatelessProcessGroup broadcast
// carries; plus what torch.load(weights_only=True) allows (torch/_weights_only_unpickler.py
// _get_allowed_globals, torch 2.6), PyTorch's own list of what rebuilds data without running code.
// Anything else, a framework's own classes included, is the operator's to allow, per key (a policy
// file's value.globals, which `storeguard policy learn` writes from a clean job's capture).
var allowedGlobals = map[string][]string{
	"builtins": {"set", "frozenset", "bytearray", "complex", "slice", "range", "object", "list", "dict",
		"tuple", "int", "float", "str", "bool", "bytes"},
	"_codecs":                {"encode"},         // bytes at protocols 0-2: _codecs.encode(str, "latin1")
	"copyreg":                {"_reconstructor"}, // an object at protocols 0-1: _reconstructor(cls, base, state)
	"_ctypes":                {"_unpickle"},      // a ctypes structure (vLLM's ncclUniqueId): _unpickle(cls, state)
	"collections":            {"OrderedDict", "Counter", "defaultdict", "deque"},
	"datetime":               {"date", "time", "datetime", "timedelta", "timezone"},
	"decimal":                {"Decimal"},
	"fractions":              {"Fraction"},
	"uuid":                   {"UUID"},
	"numpy":                  {"dtype", "ndarray"},
	"numpy.core.multiarray":  {"_reconstruct", "scalar"},
	"numpy._core.multiarray": {"_reconstruct", "scalar"},
	"numpy.core.numeric":     {"_frombuffer"},
	"numpy._core.numeric":    {"_frombuffer"},
	"torch": append(append(append(torchDtypes, torchStorages...), torchEnums...),
		"Size", "device", "Tensor", "UntypedStorage", "TypedStorage"),
	"torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
		"_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor",
		"_rebuild_meta_tensor_no_storage", "_rebuild_nested_tensor", "_rebuild_wrapper_subclass",
		"_rebuild_device_tensor_from_cpu_tensor", "_rebuild_device_tensor_from_numpy"},
	"torch._tensor":       {"_rebuild_from_type_v2"},
	"torch.storage":       {"_load_from_bytes", "UntypedStorage", "TypedStorage"}, // what it loads is judged too (pickle.go)
	"torch.nn.parameter":  {"Parameter"},
	"torch.serialization": {"_get_layout"},
	"torch.cuda":          torchStorages,
	"torch.distributed.elastic.rendezvous.dynamic_rendezvous": {"_RendezvousState", "_NodeDesc"},
	"vllm.distributed.device_communicators.pynccl_wrapper":    {"ncclUniqueId"}, // broadcast by PyNcclCommunicator
}

// torchDtypes are torch's dtype names, 1.13 to 2.15 (a dtype pickles as the global torch.<name>).
var torchDtypes = []string{"bcomplex32", "bfloat16", "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool",
	"cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64", "double", "float", "float16",
	"float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
	"float8_e8m0fnu", "float4_e2m1fn_x2", "half", "int", "int1", "int16", "int2", "int3", "int32", "int4",
	"int5", "int6", "int64", "int7", "int8", "long", "qint32", "qint8", "quint2x4", "quint4x2", "quint8",
	"short", "uint1", "uint16", "uint2", "uint3", "uint32", "uint4", "uint5", "uint6", "uint64", "uint7", "uint8"}

// torchStorages are the typed storage and tensor classes torch.load(weights_only=True) allows.
var torchStorages = []string{"BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage",
	"ComplexDoubleStorage", "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage",
	"IntStorage", "LongStorage", "QInt32Storage", "QInt8Storage", "QUInt2x4Storage", "QUInt4x2Storage",
	"QUInt8Storage", "ShortStorage", "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor",
	"DoubleTensor", "FloatTensor", "HalfTensor", "IntTensor", "LongTensor", "ShortTensor"}

// torchEnums are torch's layouts, memory formats and quantization schemes.
var torchEnums = []string{"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
	"jagged", "_mkldnn", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
	"legacy_contiguous_format", "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
	"per_channel_symmetric", "per_channel_affine_float_qparams"}

// bytesMakers build bytes from what is not a bytes literal (a list of ints): beside _load_from_bytes,
// the torch.save stream it loads could hide in one, where the guard does not read it; such a value
// is refused. _codecs.encode(str, "latin1"), how protocols 0 to 2 carry bytes, is read instead.
var bytesMakers = map[string]bool{"builtins.bytearray": true, "builtins.bytes": true}

// latin1Maker is how pickle protocols 0 to 2 carry a bytes object: _codecs.encode(str, "latin1").
const latin1Maker = "_codecs.encode"

func defaultAllow() globalAllow {
	a := globalAllow{names: map[string]bool{}, modules: map[string]bool{}}
	for m, names := range allowedGlobals {
		for _, n := range names {
			a.names[m+"."+n] = true
		}
	}
	return a
}

// unsafe says why a reader may not load r, "" when it may: every global it imports is allowed (by
// default, or by extra: a policy file's value.globals for the key) and not denied (the floor no
// allow-list lifts), and every call is a call of one of them. While learning, a global off the
// allow-list is what is learned, not a finding; the rest still is.
//
// An EXT opcode makes the unpickler look its code up in the reading process's copyreg registry,
// which is empty unless that process registered codes (nothing in the standard library, torch or
// the frameworks measured does): it raises there. A persistent id makes pickle.loads raise (it has
// no persistent_load); torch.load's unpickler of a torch.save stream has one (inSave). So what
// follows the first of them never runs, and is not judged: binary values read as pickles (a gloo
// address as base64) meet these opcodes by chance, and refusing them refused torch's own traffic.
func (p *Policy) unsafe(r *pickle.Report, extra *globalAllow, inSave bool) string {
	stop := -1 // where the reader raises: what lies after it never runs
	if r.Ext {
		stop = r.ExtOffset
	}
	if r.Persistent && !inSave && (stop < 0 || r.PersistentOffset < stop) {
		stop = r.PersistentOffset
	}
	runs := func(off int) bool { return stop < 0 || off < stop }
	for _, g := range r.Globals {
		if runs(g.Offset) && g.Resolved && importable(g) && p.deny.denied(g) {
			return "imports " + globalName(g) + ", which runs code: never allowed"
		}
	}
	for _, g := range r.Globals {
		switch {
		case !runs(g.Offset):
		case !g.Resolved:
			return "imports a global whose name the scanner could not follow (" + g.Op + " at offset " + fmt.Sprint(g.Offset) + ")"
		case !importable(g):
			// No module of that name can exist: the import raises, nothing runs.
		case p.allow.allowed(g) || extra != nil && extra.allowed(g):
		case p.cfg.Learn != nil:
			// Learning: the allow-list is what is learned (learn.go records the globals).
		default:
			return "imports " + globalName(g) + ": not on the allow-list"
		}
	}
	switch {
	case r.Truncated:
		return fmt.Sprintf("imports or calls more than %d globals: the rest unseen", p.cfg.Pickle.MaxGlobals)
	case errors.Is(r.Err, pickle.ErrLimit):
		return "is past the scanner's bounds: " + r.Err.Error()
	case r.UnknownCalls > 0:
		for _, c := range r.Calls {
			if c.Callee < 0 && runs(c.Offset) {
				return fmt.Sprintf("calls what is not an allowed global (%s at offset %d): a call's result or an unknown value", c.Op, c.Offset)
			}
		}
	}
	return ""
}

// importable reports whether g's module is a dotted path of ASCII identifiers: what an installed
// module is named. Any other name cannot be imported (ModuleNotFoundError), so the unpickler raises
// there having run nothing of it; binary values read as pickles meet such names by chance.
func importable(g pickle.Global) bool {
	for _, part := range strings.Split(g.Module, ".") {
		if part == "" || part[0] >= '0' && part[0] <= '9' {
			return false
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}

// JudgeValue judges value as Check judges a SET of key from src: what `storeguard policy judge`
// answers for a value, before any reaches a store. On a policy that keeps nothing of a store (no
// WithStore), write-once and the quota are not asked. The first finding in enforce mode is the
// answer, else the first in monitor mode.
func (p *Policy) JudgeValue(key, value []byte, src netip.Addr) (Finding, bool) {
	b, err := protocol.Append(nil, protocol.G1, protocol.Request{Op: protocol.OpSet, Key: key, Value: value})
	if err != nil {
		return Finding{Rule: protocol.RuleValueInvalid, Detail: err.Error(), Mode: Enforce}, true
	}
	lim := protocol.Limits{MaxKeyBytes: protocol.MaxLimit, MaxValueBytes: protocol.MaxLimit, MaxKeys: protocol.MaxLimit,
		MaxMessageBytes: protocol.MaxLimit}
	d := protocol.NewDecoder(protocol.Config{Gen: protocol.GenSetting{Gen: protocol.G1}, Limits: lim})
	var msg *protocol.Message
	for off := 0; msg == nil && off < len(b); {
		n, m, err := d.Scan(b[off:])
		if err != nil {
			return Finding{Rule: protocol.RuleValueInvalid, Detail: err.Error(), Mode: Enforce}, true
		}
		off, msg = off+n, m
	}
	var warned Finding
	monitor := false
	f, broke := p.Check(Message{Msg: msg, Bytes: protocol.Split{B: b}, Src: src}, func(x Finding) {
		if !monitor {
			warned, monitor = x, true
		}
	})
	if broke {
		return f, true
	}
	return warned, monitor
}

// AllowedGlobals is the default allow-list, sorted: what a pickle may import and call on any key.
func AllowedGlobals() []string {
	var out []string
	for m, names := range allowedGlobals {
		for _, n := range names {
			out = append(out, m+"."+n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
