package storeinfo

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// What Linux's /proc says of the sockets listening in this network namespace and of the process
// that holds one: for the exposure warning (WarnExposure) and for caps.max-store-connections: auto
// (limit.go). Elsewhere than Linux the files are missing and every lookup fails.

// procRoot is where proc is mounted; tests point it at a fixture.
var procRoot = "/proc"

// procListener is one listening TCP socket of /proc/net/tcp or tcp6.
type procListener struct {
	addr  netip.AddrPort // the address it is bound to; unspecified for every address
	inode uint64
	// backlog is how many connections its accept queue holds (listen's backlog, as the kernel
	// capped it); 0: unknown (/proc does not print it).
	backlog int
}

// procListeners lists the listening TCP sockets of this network namespace: by sock_diag, or where
// that fails (or a test points procRoot at a fixture) from /proc/net/tcp and tcp6.
func procListeners() []procListener {
	if procRoot == "/proc" {
		if ls, err := diagListeners(); err == nil {
			return ls
		}
	}
	return fileListeners()
}

// fileListeners lists the listening TCP sockets of /proc/net/tcp and tcp6.
func fileListeners() []procListener {
	var out []procListener
	for _, f := range []string{"self/net/tcp", "self/net/tcp6"} {
		fh, err := os.Open(procRoot + "/" + f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			if l, ok := parseProcListener(sc.Text()); ok {
				out = append(out, l)
			}
		}
		fh.Close()
	}
	return out
}

// parseProcListener reads one line of /proc/net/tcp*: "sl local rem st ... uid timeout inode".
func parseProcListener(line string) (procListener, bool) {
	fields := strings.Fields(line)
	if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
		return procListener{}, false
	}
	hexAddr, hexPort, ok := strings.Cut(fields[1], ":")
	if !ok {
		return procListener{}, false
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return procListener{}, false
	}
	ip, ok := netip.AddrFromSlice(procIP(hexAddr))
	if !ok {
		return procListener{}, false
	}
	inode, err := strconv.ParseUint(fields[9], 10, 64)
	if err != nil {
		return procListener{}, false
	}
	return procListener{addr: netip.AddrPortFrom(ip.Unmap(), uint16(port)), inode: inode}, true
}

// procIP decodes an address of /proc/net/tcp*: 32-bit words in host (little-endian) order.
func procIP(h string) net.IP {
	if len(h) != 8 && len(h) != 32 {
		return nil
	}
	ip := make(net.IP, len(h)/2)
	for w := 0; w < len(h)/8; w++ {
		v, err := strconv.ParseUint(h[8*w:8*w+8], 16, 32)
		if err != nil {
			return nil
		}
		for i := range 4 {
			ip[4*w+i] = byte(v >> (8 * i))
		}
	}
	return ip
}

// errHidden: some processes' descriptors could not be read (another user's process without
// CAP_SYS_PTRACE, or /proc mounted with hidepid), and none of the others holds the socket.
var errHidden = errors.New("the process holding it is not readable: run storeguard as the store's user or as root, " +
	"in its PID namespace (a Kubernetes sidecar needs shareProcessNamespace)")

// socketOwner is the process holding the socket inode: guess first (the one found last time),
// else every process in /proc is looked at.
func socketOwner(inode uint64, guess int) (int, error) {
	link := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	if guess > 0 && holds(guess, link) == nil {
		return guess, nil
	}
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, err
	}
	hidden := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == guess {
			continue
		}
		switch err := holds(pid, link); {
		case err == nil:
			return pid, nil
		case errors.Is(err, fs.ErrPermission):
			hidden = true
		}
	}
	if hidden {
		return 0, errHidden
	}
	return 0, errors.New("no process in " + procRoot + " holds it")
}

var errNotHeld = errors.New("not held")

// holds reports nil when process pid has a descriptor for link ("socket:[inode]").
func holds(pid int, link string) error {
	dir := procRoot + "/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == link {
			return nil
		}
	}
	return errNotHeld
}

// procFiles is a process's soft RLIMIT_NOFILE (-1: unlimited) and how many descriptors it has open.
func procFiles(pid int) (soft int64, open int, err error) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0, 0, err
	}
	if soft, err = parseOpenFilesLimit(string(b)); err != nil {
		return 0, 0, err
	}
	ents, err := os.ReadDir(procRoot + "/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return 0, 0, err
	}
	return soft, len(ents), nil
}

// parseOpenFilesLimit reads the soft limit of "Max open files" in /proc/<pid>/limits.
func parseOpenFilesLimit(limits string) (int64, error) {
	for _, line := range strings.Split(limits, "\n") {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		if f[0] == "unlimited" {
			return -1, nil
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			break
		}
		return n, nil
	}
	return 0, fmt.Errorf("no soft \"Max open files\" in limits")
}
