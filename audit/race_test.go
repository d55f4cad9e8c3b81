//go:build race

package audit

// raceDetector: the race detector makes a single goroutine's loop about 8 times slower, and finds
// nothing in it; long loops shorten under it.
const raceDetector = true
