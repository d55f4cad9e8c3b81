package pidfile

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// sleeper is a process of the test's, gone at the end: one that is not a storeguard.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func written(t *testing.T, keeper int) (string, *Writer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "worker.pid")
	w := NewWriter(path)
	if err := w.Write(keeper); err != nil {
		t.Fatal(err)
	}
	return path, w
}

// The pid file names this process, and its record names it exactly: Check lets it (and the keeper
// the record names) be signalled, and nothing else.
func TestCheckNamesTheWriter(t *testing.T) {
	path, _ := written(t, os.Getppid())
	if got, err := ReadPID(path); err != nil || got != os.Getpid() {
		t.Fatalf("ReadPID = %d, %v; want %d", got, err, os.Getpid())
	}
	if err := Check(path, os.Getpid()); err != nil {
		t.Errorf("Check(self): %v", err)
	}
	if err := Check(path, os.Getppid()); err != nil {
		t.Errorf("Check(keeper): %v", err)
	}
	if err := Check(path, sleeper(t).Process.Pid); err == nil {
		t.Error("Check let another process through as the storeguard's keeper")
	}
	rec, _ := ReadRecord(path)
	if rec.ExeIno == 0 || rec.Start == 0 {
		t.Fatalf("the record does not name the executable and start: %+v", rec)
	}
	rec.ExeIno++ // the same PID and start, another executable
	b, _ := json.Marshal(rec)
	os.WriteFile(RecordPath(path), b, 0o644)
	if err := Check(path, os.Getpid()); !errors.Is(err, ErrStale) {
		t.Errorf("Check with another executable: %v, want %v", err, ErrStale)
	}
}

// A stale pid file whose PID another process took: refused, by the record's start time, or
// without a record (a storeguard from before them) because that process started after the file
// was written.
func TestCheckRefusesAReusedPID(t *testing.T) {
	path, _ := written(t, 0)
	rec, err := ReadRecord(path)
	if err != nil || rec == nil {
		t.Fatalf("ReadRecord: %v, %v", rec, err)
	}
	other := sleeper(t).Process.Pid
	rec.PID = other // as if the kernel gave the dead storeguard's PID to sleep
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(RecordPath(path), b, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte(strconv.Itoa(other)+"\n"), 0o644)
	if err := Check(path, other); !errors.Is(err, ErrStale) {
		t.Errorf("Check with a record: %v, want %v", err, ErrStale)
	}

	os.Remove(RecordPath(path))
	past := time.Now().Add(-time.Hour)
	os.Chtimes(path, past, past)
	if err := Check(path, other); !errors.Is(err, ErrStale) {
		t.Errorf("Check without a record, the file older than the process: %v, want %v", err, ErrStale)
	}
	os.WriteFile(path, []byte(strconv.Itoa(other)+"\n"), 0o644) // written after it started: it may be the one
	if err := Check(path, other); err != nil {
		t.Errorf("Check without a record, the file newer than the process: %v", err)
	}
	if err := Check(path, 1<<22+1); !errors.Is(err, ErrStale) { // above pid_max: no such process
		t.Errorf("Check of a process that does not run: %v, want %v", err, ErrStale)
	}
}

// Failed counts each failure in the record, with its reason.
func TestFailedIsRecorded(t *testing.T) {
	path, w := written(t, 0)
	for i := 1; i <= 2; i++ {
		if err := w.Failed(errors.New("the new process: exit status 3")); err != nil {
			t.Fatal(err)
		}
		rec, err := ReadRecord(path)
		if err != nil || rec.UpgradesFailed != i || rec.Failure != "the new process: exit status 3" || rec.PID != os.Getpid() {
			t.Fatalf("after %d failures the record is %+v (%v)", i, rec, err)
		}
	}
	if err := NewWriter("").Failed(errors.New("x")); err != nil {
		t.Errorf("no pid file: %v", err)
	}
}

// Field 22 is counted after the command name, which may hold spaces and parentheses.
func TestStartTicks(t *testing.T) {
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10"
	if got, err := startTicks([]byte(line)); err != nil || got != 987654 {
		t.Errorf("startTicks = %d, %v; want 987654", got, err)
	}
	if _, err := startTicks([]byte("4242 (a) S 1")); err == nil {
		t.Error("a short line parsed")
	}
}
