package tlsrelay

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// NewSharedLedger is a ledger of n slots in shared memory (a memfd), whose descriptor (Fd) a
// keeper holds: its state outlives this process.
func NewSharedLedger(n int) (*Ledger, error) {
	fd, err := unix.MemfdCreate("storeguard-tls-ledger", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	if err := unix.Ftruncate(fd, int64(n*SlotSize)); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("ftruncate", err)
	}
	l, err := mapLedger(fd, n)
	if err != nil {
		unix.Close(fd)
	}
	return l, err
}

// OpenLedger maps the shared ledger fd (a keeper's copy, received after a crash; the ledger
// takes fd). Every slot is free until claimed by Restore.
func OpenLedger(fd int) (*Ledger, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("fstat", err)
	}
	if st.Size <= 0 || st.Size%SlotSize != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("tlsrelay: a ledger of %d bytes", st.Size)
	}
	l, err := mapLedger(fd, int(st.Size/SlotSize))
	if err != nil {
		unix.Close(fd)
	}
	return l, err
}

func mapLedger(fd, n int) (*Ledger, error) {
	mem, err := unix.Mmap(fd, 0, n*SlotSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return &Ledger{mem: mem, fd: fd, used: make([]bool, n)}, nil
}
