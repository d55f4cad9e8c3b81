package audit

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MaxLineBytes is the longest line Events decodes; longer lines are
// reported as malformed and skipped. Real events are well under 4 KiB.
const MaxLineBytes = 1 << 20

// LineError reports a line that is not a valid event. Reading goes on.
type LineError struct {
	File string
	Line int
	Err  error
}

func (e *LineError) Error() string {
	if e.File == "" {
		return fmt.Sprintf("line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

func (e LineError) MarshalJSON() ([]byte, error) {
	var msg string
	if e.Err != nil {
		msg = e.Err.Error()
	}
	return json.Marshal(struct {
		File  string `json:"file,omitempty"`
		Line  int    `json:"line"`
		Error string `json:"error"`
	}{e.File, e.Line, msg})
}

var (
	errLineTooLong = errors.New("line too long")
	errNoAction    = errors.New("no event.action")
	errNoTimestamp = errors.New("no @timestamp")
)

var gzipMagic = []byte{0x1f, 0x8b}

// Events yields the events of one audit log, plain or gzip (told apart by
// magic bytes). Every error is a *LineError: after a malformed line reading
// goes on, after a read error (a truncated gzip, say) the sequence ends.
// Blank lines are skipped.
func Events(r io.Reader) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		br := bufio.NewReader(r)
		if magic, _ := br.Peek(2); bytes.Equal(magic, gzipMagic) {
			zr, err := gzip.NewReader(br)
			if err != nil {
				yield(Event{}, &LineError{Line: 1, Err: err})
				return
			}
			defer zr.Close()
			br = bufio.NewReader(zr)
		}
		for line := 1; ; line++ {
			text, err := readLine(br)
			if err != nil && err != io.EOF && !errors.Is(err, errLineTooLong) {
				yield(Event{}, &LineError{Line: line, Err: err})
				return
			}
			if errors.Is(err, errLineTooLong) || len(bytes.TrimSpace(text)) > 0 {
				e, perr := parseLine(text, err)
				if perr != nil {
					perr = &LineError{Line: line, Err: perr}
				}
				if !yield(e, perr) {
					return
				}
			}
			if err == io.EOF {
				return
			}
		}
	}
}

// readLine returns the next line without its line ending. A line over
// MaxLineBytes is consumed and reported as errLineTooLong.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			line = append(line, chunk...)
			if len(bytes.TrimRight(line, "\r\n")) > MaxLineBytes {
				tooLong, line = true, nil
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if tooLong && (err == nil || err == io.EOF) {
			err = errLineTooLong // a following call reports io.EOF
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

func parseLine(text []byte, readErr error) (Event, error) {
	if errors.Is(readErr, errLineTooLong) {
		return Event{}, errLineTooLong
	}
	var e Event
	if err := json.Unmarshal(text, &e); err != nil {
		return Event{}, err
	}
	if e.Action == "" {
		return Event{}, errNoAction
	}
	if e.Timestamp.IsZero() {
		return Event{}, errNoTimestamp
	}
	return e, nil
}

// RotatedFiles returns path's backups that exist, oldest first
// (path.N[.gz] … path.1[.gz]), followed by path itself.
func RotatedFiles(path string) ([]string, error) {
	matches, err := filepath.Glob(escapeGlob(path) + ".*")
	if err != nil {
		return nil, err
	}
	type backup struct {
		name string
		n    int
	}
	var backups []backup
	for _, m := range matches {
		suffix := strings.TrimSuffix(strings.TrimPrefix(m, path+"."), ".gz")
		if n, err := strconv.Atoi(suffix); err == nil && n > 0 {
			backups = append(backups, backup{m, n})
		}
	}
	slices.SortFunc(backups, func(a, b backup) int { return b.n - a.n })
	files := make([]string, 0, len(backups)+1)
	for _, b := range backups {
		files = append(files, b.name)
	}
	if _, err := os.Stat(path); err == nil {
		files = append(files, path)
	}
	return files, nil
}

func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
