package progress

import "io"

// isTerminalWriter reports whether w is a terminal: a file whose descriptor answers a terminal's
// ioctl (a pipe, a regular file and /dev/null do not).
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && isTerminal(f.Fd())
}
