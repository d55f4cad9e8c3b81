package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// CPU is the CPU time spent over a run's measured interval: by the whole machine, and by the
// processes the run was asked to watch (a proxy, a store), read from Linux's /proc.
type CPU struct {
	Cores      int       `json:"cores"`
	CoresBusyS float64   `json:"cores_busy_s"` // all cores, all processes: user, nice, system, irq, softirq, steal
	Processes  []ProcCPU `json:"processes,omitempty"`
}

// ProcCPU is one watched process's user and system time over the interval.
type ProcCPU struct {
	PID  int     `json:"pid"`
	Name string  `json:"name"`
	CPUS float64 `json:"cpu_s"`
}

// userHz is the unit of /proc's CPU counters: USER_HZ, 100 on every Linux architecture's ABI.
const userHz = 100

// cpuWindow measures a CPU: start takes the counters, end takes them again. Counters that cannot
// be read (no /proc, a process that exited) are left out, not reported as zero.
type cpuWindow struct {
	busy   time.Duration
	busyOK bool
	pids   []int
	names  []string
	procs  []time.Duration
	procOK []bool
}

func startCPU(pids []int) *cpuWindow {
	w := &cpuWindow{pids: pids}
	w.busy, w.busyOK = coresBusy()
	for _, pid := range pids {
		name, t, err := procCPU(pid)
		w.names = append(w.names, name)
		w.procs = append(w.procs, t)
		w.procOK = append(w.procOK, err == nil)
	}
	return w
}

func (w *cpuWindow) end() *CPU {
	busy, ok := coresBusy()
	if !ok || !w.busyOK {
		return nil
	}
	c := &CPU{Cores: runtime.NumCPU(), CoresBusyS: (busy - w.busy).Seconds()}
	for i, pid := range w.pids {
		if _, t, err := procCPU(pid); err == nil && w.procOK[i] {
			c.Processes = append(c.Processes, ProcCPU{PID: pid, Name: w.names[i], CPUS: (t - w.procs[i]).Seconds()})
		}
	}
	return c
}

// coresBusy is how long this machine's cores have been busy in total since boot, from /proc/stat:
// user, nice, system, irq, softirq and steal time (not idle or iowait). ok is false where there is
// no /proc/stat.
func coresBusy() (busy time.Duration, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	busy, err = parseCPULine(sc.Text())
	return busy, err == nil
}

// parseCPULine reads the busy time from /proc/stat's first line ("cpu user nice system idle iowait
// irq softirq steal ...").
func parseCPULine(line string) (time.Duration, error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: field %d of %q: %w", i, line, err)
		}
		ticks += v
	}
	return ticks2dur(ticks), nil
}

// procCPU is a process's name and the user plus system time of all its threads so far.
func procCPU(pid int) (string, time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	return parseProcStat(b)
}

// parseProcStat reads /proc/PID/stat: "pid (comm) state ppid ..." with utime and stime the 14th
// and 15th fields. The name may hold spaces and parentheses: it ends at the last ") ".
func parseProcStat(b []byte) (string, time.Duration, error) {
	lp, rp := bytes.IndexByte(b, '('), bytes.LastIndex(b, []byte(") "))
	if lp < 0 || rp < lp {
		return "", 0, fmt.Errorf("/proc/PID/stat: no (name) in %q", b)
	}
	f := strings.Fields(string(b[rp+2:])) // from field 3, state
	if len(f) < 13 {
		return "", 0, fmt.Errorf("/proc/PID/stat: %d fields after the name, want at least 13", len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("/proc/PID/stat: %w", err)
		}
		ticks += v
	}
	return string(b[lp+1 : rp]), ticks2dur(ticks), nil
}

func ticks2dur(ticks uint64) time.Duration { return time.Duration(ticks) * time.Second / userHz }
