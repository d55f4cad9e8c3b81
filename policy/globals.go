package policy

import (
	"fmt"
	"strings"

	"github.com/storeguard/storeguard/pickle"
	"github.com/storeguard/storeguard/protocol"
)

// The globals a pickle may not import on any key: what picklescan (mmaitre314/picklescan
// _unsafe_globals) and fickling (trailofbits/fickling UNSAFE_IMPORTS) flag, as a floor, and more of
// the same kind. Each runs code, a process, a file or a connection once called, or reaches one by
// attribute (getattr, attrgetter). No pickle of the job's own data needs any of them.
var (
	// deniedModules: every name in the module, and in its submodules.
	deniedModules = []string{
		"os", "posix", "nt", "posixpath", "ntpath", "subprocess", "_posixsubprocess", "sys", "pty",
		"socket", "_socket", "ssl", "shutil", "runpy", "importlib", "imp", "zipimport", "pkgutil",
		"ctypes", "_ctypes", "cffi", "code", "codeop", "marshal", "pickle", "_pickle", "cPickle",
		"pickletools", "dill", "cloudpickle", "joblib", "shelve", "pdb", "bdb", "trace", "timeit",
		"profile", "cProfile", "pydoc", "webbrowser", "asyncio", "multiprocessing", "concurrent",
		"threading", "_thread", "signal", "platform", "commands", "popen2", "site", "sysconfig",
		"distutils", "setuptools", "pip", "ensurepip", "venv", "tempfile", "glob", "io", "_io",
		"fileinput", "linecache", "tarfile", "zipfile", "http.client", "http.server", "httplib",
		"urllib.request", "urllib2", "urllib3", "requests", "aiohttp", "ftplib", "smtplib", "telnetlib", "poplib", "imaplib",
		"xmlrpc", "socketserver", "wsgiref", "gc", "inspect", "compileall",
		"py_compile", "tkinter", "idlelib", "lib2to3", "mailcap",
		"torch.hub", "torch.jit", "torch.serialization", "torch.package", "torch.utils.cpp_extension",
		"torch._inductor", "torch._dynamo", "torch.distributed.rpc", "numpy.testing", "numpy.f2py",
		"numpy.distutils", "IPython", "pandas.io",
	}
	// deniedNames: these names of these modules.
	deniedNames = map[string][]string{
		"builtins": {"eval", "exec", "execfile", "compile", "open", "__import__", "getattr", "setattr",
			"delattr", "globals", "locals", "vars", "breakpoint", "input", "apply", "help", "exit",
			"quit", "reload", "file", "__build_class__", "__loader__", "__spec__"},
		"operator": {"attrgetter", "methodcaller", "call"},
		"numpy":    {"load", "loads", "fromfile", "memmap"},
		"torch":    {"load", "jit", "hub", "compile", "ops", "classes"},
	}
	// deniedComponents: a dotted name (protocol 4's attribute paths) or module path with one of these
	// parts reaches code through another module's attributes (torch.serialization.os.system).
	deniedComponents = []string{"__builtins__", "__globals__", "__import__", "__subclasses__",
		"__class__", "__base__", "__bases__", "__mro__", "__dict__", "__getattribute__", "__code__",
		"__closure__", "__func__", "__self__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__",
		"__init__", "__call__", "__getattr__", "__setattr__", "__delattr__",
		"eval", "exec", "compile", "getattr", "setattr", "system", "popen", "spawn", "spawnl",
		"spawnv", "execv", "execve", "execl", "fork", "Popen", "call", "check_call", "check_output",
		"run", "startfile", "os", "sys", "subprocess", "builtins", "__builtin__", "posix", "nt",
		"importlib", "runpy", "pty", "socket", "shutil", "ctypes", "pickle", "_pickle", "marshal"}
)

// allowedNames are exceptions to deniedModules: names that rebuild data and call nothing of their
// own. _ctypes._unpickle(type, state) is how a ctypes Structure pickles (vLLM's PyNccl sends its
// ncclUniqueId so); the type is a global of its own, judged by itself.
// torch.serialization._get_layout(name) returns a layout by its name (torch.load(weights_only=True)
// allows it; the rest of torch.serialization, torch.load among it, stays denied).
var allowedNames = map[string]bool{"_ctypes._unpickle": true, "torch.serialization._get_layout": true}

// moduleNames are modules that no name of a pickle may be, whatever module it is found in: a
// module's attribute that is such a module hands it over (pathlib.os, then os.system by name).
var moduleNames = map[string]bool{"os": true, "sys": true, "subprocess": true, "builtins": true,
	"__builtins__": true, "__builtin__": true, "posix": true, "nt": true, "importlib": true, "runpy": true,
	"pty": true, "socket": true, "shutil": true, "ctypes": true, "pickle": true, "_pickle": true,
	"marshal": true, "code": true, "pdb": true, "_posixsubprocess": true}

// builtinAliases are the module names the unpickler resolves to builtins (fix_imports maps
// Python 2's __builtin__ to builtins before import; the scanner reports the mapped name, these are
// for DenyGlobals written the old way).
var builtinAliases = []string{"__builtin__", "__builtins__"}

// globalSet is a deny list of globals.
type globalSet struct {
	modules    map[string]bool            // every name of the module and its submodules
	names      map[string]map[string]bool // module → names
	components map[string]bool
}

func defaultDeny() globalSet {
	g := globalSet{modules: map[string]bool{}, names: map[string]map[string]bool{}, components: map[string]bool{}}
	for _, m := range deniedModules {
		g.modules[m] = true
	}
	for m, ns := range deniedNames {
		for _, n := range ns {
			g.addName(m, n)
		}
		for _, a := range builtinAliases {
			if m == "builtins" {
				for _, n := range ns {
					g.addName(a, n)
				}
			}
		}
	}
	for _, c := range deniedComponents {
		g.components[c] = true
	}
	return g
}

func (g globalSet) addName(module, name string) {
	if g.names[module] == nil {
		g.names[module] = map[string]bool{}
	}
	g.names[module][name] = true
}

// add adds "module.name" and "module.*" entries.
func (g globalSet) add(entries []string) error {
	for _, e := range entries {
		dot := strings.LastIndexByte(e, '.')
		if dot <= 0 || dot == len(e)-1 {
			return fmt.Errorf("%q is not module.name or module.*", e)
		}
		if m, n := e[:dot], e[dot+1:]; n == "*" {
			g.modules[m] = true
		} else {
			g.addName(m, n)
		}
	}
	return nil
}

// denied reports whether gl may not be imported, and why (the global as module.name).
func (g globalSet) denied(gl pickle.Global) bool {
	if !gl.Resolved {
		return true // operands the scanner did not keep: it could be anything
	}
	mod, name := gl.Module, gl.Name
	if allowedNames[mod+"."+name] {
		return false
	}
	for m := mod; ; {
		if g.modules[m] {
			return true
		}
		dot := strings.LastIndexByte(m, '.')
		if dot < 0 {
			break
		}
		m = m[:dot]
	}
	first, _, _ := strings.Cut(name, ".")
	if g.names[mod][first] || g.names[mod][name] {
		return true
	}
	if moduleNames[first] {
		return true // a module object reached as another module's attribute: pathlib.os
	}
	if strings.Contains(name, ".") {
		for _, part := range strings.Split(name, ".") {
			if g.components[part] || strings.HasPrefix(part, "__") {
				return true
			}
		}
	}
	return false
}

// globalName is gl as module.name, "?" for one not resolved.
func globalName(gl pickle.Global) string {
	if !gl.Resolved {
		return "?"
	}
	return protocol.ShowKey([]byte(gl.Module + "." + gl.Name)) // the pickle's bytes: escaped for logs and terminals
}
