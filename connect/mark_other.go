//go:build !linux

package connect

import "errors"

func setMark(int, int) error { return errors.New("SO_MARK needs Linux") }
