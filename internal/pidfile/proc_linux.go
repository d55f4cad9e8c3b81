package pidfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux architecture
// Go runs on.
const clockTicks = 100

// Lookup reads what names process pid from /proc: its start time (field 22 of its stat line), the
// boot, and its executable when this user may see it (the same user, or root).
func Lookup(pid int) (Process, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Process{}, errors.New("no such process")
		}
		return Process{}, err
	}
	start, err := startTicks(stat)
	if err != nil {
		return Process{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	p := Process{PID: pid, Start: start}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		p.BootID = strings.TrimSpace(string(b))
	}
	exe := fmt.Sprintf("/proc/%d/exe", pid)
	var st unix.Stat_t
	if err := unix.Stat(exe, &st); err == nil {
		p.ExeDev, p.ExeIno = st.Dev, st.Ino
	}
	if path, err := os.Readlink(exe); err == nil {
		p.Exe = strings.TrimSuffix(path, " (deleted)") // the binary was replaced since (an install)
	}
	return p, nil
}

// startTicks is field 22 of a /proc/PID/stat line. The second field, the command name in
// parentheses, may hold spaces and parentheses itself: fields are counted after its last ')'.
func startTicks(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	f := strings.Fields(string(stat[i+1:])) // field 3 on
	if len(f) < 20 {
		return 0, errors.New("too few fields")
	}
	return strconv.ParseUint(f[22-3], 10, 64)
}

// StartTime is when p started, by the wall clock: the boot time (/proc/stat's btime) and p's start.
func StartTime(p Process) (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat btime: %w", err)
			}
			return time.Unix(boot, 0).Add(time.Duration(p.Start) * time.Second / clockTicks), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat has no btime")
}
