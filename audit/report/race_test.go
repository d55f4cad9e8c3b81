//go:build race

package report

// raceDetector: the race detector makes a single goroutine's loop about 8 times slower, and finds
// nothing in it; long loops shorten under it.
const raceDetector = true
