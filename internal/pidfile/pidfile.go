// Package pidfile keeps serve's --pid-file and the record beside it (PIDFILE.json), and checks a
// PID against them before `storeguard upgrade` signals it. A pid file outlives its process, and
// the kernel gives its PID to any other: a SIGUSR2 sent on a stale pid file killed an unrelated
// process. The record names the process exactly (its executable, its start time after boot, the
// boot) and says how its upgrades in place failed, which the upgrade command reads to learn the
// outcome at once instead of waiting for a timeout.
package pidfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/storeguard/storeguard/internal/atomicfile"
)

// Process names one process: a PID alone does not (it is reused).
type Process struct {
	PID    int    `json:"pid"`
	Start  uint64 `json:"start_ticks"`       // /proc/PID/stat field 22: when it started, in clock ticks after boot
	BootID string `json:"boot_id,omitempty"` // /proc/sys/kernel/random/boot_id
	// The executable, /proc/PID/exe: the file (device and inode, the same from every mount
	// namespace: a Kubernetes upgrade runs in another container) and, for people, its path.
	ExeDev uint64 `json:"exe_dev,omitempty"`
	ExeIno uint64 `json:"exe_ino,omitempty"`
	Exe    string `json:"exe,omitempty"`
}

// Same reports whether q is the process p names: the same PID, start and boot, and the same
// executable file where both are known (another user's /proc/PID/exe cannot be read; /proc/sys
// is hidden from a systemd unit with ProcSubset=pid).
func (p Process) Same(q Process) bool {
	known := func(a, b string) bool { return a == "" || b == "" || a == b }
	return p.PID == q.PID && p.Start == q.Start && known(p.BootID, q.BootID) &&
		(p.ExeIno == 0 || q.ExeIno == 0 || (p.ExeDev == q.ExeDev && p.ExeIno == q.ExeIno))
}

// Record is what a serving process writes beside its pid file.
type Record struct {
	Process
	Keeper *Process `json:"keeper,omitempty"` // the keeper that runs it (serve --keeper): SIGUSR2 may go there
	// UpgradesFailed counts this process's upgrades in place that failed (it serves on); Failure
	// says why the last one did.
	UpgradesFailed int       `json:"upgrades_failed"`
	Failure        string    `json:"failure,omitempty"`
	FailedAt       time.Time `json:"failed_at,omitzero"`
}

// RecordPath is where the record of the pid file at path is.
func RecordPath(path string) string { return path + ".json" }

// Writer keeps the pid file and record of the serving process. The zero path writes nothing.
type Writer struct {
	path string
	mu   sync.Mutex
	rec  Record
}

// NewWriter is the writer of the pid file at path ("" for none); nothing is written before Write.
func NewWriter(path string) *Writer { return &Writer{path: path} }

// Write writes this process's PID to the pid file and its record beside it; keeper, if not 0, is
// the PID of the keeper that runs it.
func (w *Writer) Write(keeper int) error {
	if w.path == "" {
		return nil
	}
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	self, err := Lookup(os.Getpid())
	if err != nil { // not Linux: the pid file alone, which upgrade (Linux only) does not read
		return errors.Join(replace(w.path, pid), fmt.Errorf("pid-file record: %w", err))
	}
	rec := Record{Process: self}
	if keeper > 0 {
		k, err := Lookup(keeper)
		if err != nil {
			return fmt.Errorf("the keeper: %w", err)
		}
		rec.Keeper = &k
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rec = rec
	// The record first: a reader that sees the new PID finds the record that names it.
	if err := w.writeRecord(); err != nil {
		return err
	}
	return replace(w.path, pid)
}

// Failed records an upgrade in place that failed, and why.
func (w *Writer) Failed(why error) error {
	if w.path == "" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rec.PID == 0 {
		return errors.New("pid-file: not written yet")
	}
	w.rec.UpgradesFailed++
	w.rec.Failure, w.rec.FailedAt = why.Error(), time.Now().UTC()
	return w.writeRecord()
}

func (w *Writer) writeRecord() error {
	b, err := json.Marshal(w.rec)
	if err != nil {
		return err
	}
	return replace(RecordPath(w.path), append(b, '\n'))
}

// replace writes path whole (atomicfile): a reader sees the old content or the new.
func replace(path string, data []byte) error {
	err := atomicfile.Write(path, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("pid-file: %w", err)
	}
	return nil
}

// ReadPID reads the PID in the pid file at path.
func ReadPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("pid-file: %w", err)
	}
	p, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || p <= 0 {
		return 0, fmt.Errorf("pid-file %s: %q is not a pid", path, strings.TrimSpace(string(b)))
	}
	return p, nil
}

// ReadRecord reads the record beside the pid file at path; nil, without an error, when there is
// none (a storeguard from before records were written).
func ReadRecord(path string) (*Record, error) {
	b, err := os.ReadFile(RecordPath(path))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pid-file record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("pid-file record %s: %w", RecordPath(path), err)
	}
	return &r, nil
}

// ErrStale: the PID is not the storeguard the pid file was written for.
var ErrStale = errors.New("stale pid file")

// Check reports whether target may be signalled to upgrade the storeguard whose pid file is at
// path: it must be the process the pid file's record names (or the keeper that runs it), by PID,
// executable, start time and boot. Without a record (a storeguard from before them), target must
// at least have started before the pid file was last written: a process that reused the PID
// started after.
func Check(path string, target int) error {
	named, err := ReadPID(path)
	if err != nil {
		return err
	}
	proc, err := Lookup(target)
	if err != nil {
		return fmt.Errorf("%w %s: pid %d: %v", ErrStale, path, target, err)
	}
	rec, err := ReadRecord(path)
	if err != nil {
		return err
	}
	if rec == nil || rec.PID != named {
		return startedBefore(path, proc)
	}
	want := rec.Process
	if target != named {
		if rec.Keeper == nil || rec.Keeper.PID != target {
			return fmt.Errorf("pid %d is neither the storeguard %s names (pid %d) nor its keeper", target, path, named)
		}
		want = *rec.Keeper
	}
	if !want.Same(proc) {
		return fmt.Errorf("%w %s: pid %d is not the storeguard that wrote it (%s, started at tick %d), but %s, started at tick %d",
			ErrStale, path, target, want.Exe, want.Start, orUnknown(proc.Exe), proc.Start)
	}
	return nil
}

func orUnknown(s string) string {
	if s == "" {
		return "an executable this user cannot see"
	}
	return s
}

// startedBefore checks that proc started before the pid file at path was last written, with a
// second's slack for the clocks' rounding (boot time is in whole seconds).
func startedBefore(path string, proc Process) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("pid-file: %w", err)
	}
	started, err := StartTime(proc)
	if err != nil {
		return err
	}
	if started.After(fi.ModTime().Add(time.Second)) {
		return fmt.Errorf("%w %s: pid %d started at %s, after the file was written (%s): another process has the PID",
			ErrStale, path, proc.PID, started.Format(time.RFC3339), fi.ModTime().Format(time.RFC3339))
	}
	return nil
}
