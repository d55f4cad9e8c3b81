//go:build !linux

package upgrade

import "os"

// Old is the serving process's end of an upgrade (Linux only).
type Old struct{ Peer Ready }

// WaitReady fails: upgrade in place needs Linux.
func WaitReady(*os.File, <-chan struct{}) (*Old, error) { return nil, ErrNeedsLinux }

func (*Old) Close()                                                  {}
func (*Old) Gone() bool                                              { return true }
func (*Old) Refuse(error)                                            {}
func (*Old) Send(ServerState, func(int) (Conn, error), func()) error { return ErrNeedsLinux }
func (*Old) Go() error                                               { return ErrNeedsLinux }

// Next is the end of the process taking over (Linux only).
type Next struct{ From ServerState }

// Join fails: upgrade in place needs Linux.
func Join(*os.File) (*Next, error) { return nil, ErrNeedsLinux }

func (*Next) Close()                   {}
func (*Next) Refuse(error)             {}
func (*Next) Receive(func(Conn)) error { return ErrNeedsLinux }
