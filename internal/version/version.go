// Package version is storeguard's version, as the Go toolchain stamped it into the binary.
package version

import "runtime/debug"

// String is the module version the binary was built from (a tag, or a pseudo-version for a
// commit), or "devel" for a build from a working tree.
func String() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}
