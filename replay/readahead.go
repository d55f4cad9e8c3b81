package replay

import (
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// Reading a capture with pcapgo costs about as much as decoding what it holds, so a goroutine
// reads ahead (readAhead.readPackets) while the capture's goroutine decodes: on a machine with
// two cores, each does half the work. pcapgo's zero-copy read reuses its buffer, so each packet is
// copied into a batch; a few batches go round between the two goroutines.

const (
	batchBytes   = 256 << 10
	batchPackets = 1024
	batches      = 8 // in flight between the reader and the capture
	// maxKeptBatchBytes bounds the buffer a batch keeps after holding an unusually large packet.
	maxKeptBatchBytes = 4 << 20
)

// readAhead runs a packetSource in its own goroutine.
type readAhead struct {
	src  packetSource
	full chan *packetBatch // batches read, in file order; the last one carries the error
	free chan *packetBatch // batches the capture is done with
	quit chan struct{}
	done chan struct{}
}

// packetBatch is packets read in a row, their bytes back to back in data.
type packetBatch struct {
	data      []byte
	pkts      []batchedPacket
	err       error // what ended reading after pkts (io.EOF at a clean end); nil if reading goes on
	errOffset int64 // src.offset() of the record that could not be read
}

type batchedPacket struct {
	ci         gopacket.CaptureInfo
	lt         layers.LinkType
	start, end int // the packet's bytes in data
}

func (b *packetBatch) bytes(p *batchedPacket) []byte { return b.data[p.start:p.end] }

// startReadAhead starts reading src in a goroutine; stop ends it.
func startReadAhead(src packetSource) *readAhead {
	ra := &readAhead{src: src, full: make(chan *packetBatch, batches), free: make(chan *packetBatch, batches),
		quit: make(chan struct{}), done: make(chan struct{})}
	for range batches {
		// Buffers grow as packets come, so that a small capture allocates little.
		ra.free <- &packetBatch{}
	}
	go ra.readPackets()
	return ra
}

// stop ends the reader and waits for it, so that the source is not read after run returns.
func (ra *readAhead) stop() {
	close(ra.quit)
	<-ra.done
}

func (ra *readAhead) readPackets() {
	defer close(ra.done)
	for {
		var b *packetBatch
		select {
		case b = <-ra.free:
		case <-ra.quit:
			return
		}
		if cap(b.data) > maxKeptBatchBytes {
			b.data = nil
		}
		b.data, b.pkts, b.err = b.data[:0], b.pkts[:0], nil
		for len(b.data) < batchBytes && len(b.pkts) < batchPackets {
			off := ra.src.offset()
			data, ci, lt, err := ra.src.next()
			if err != nil {
				b.err, b.errOffset = err, off
				break
			}
			start := len(b.data)
			b.data = append(b.data, data...)
			b.pkts = append(b.pkts, batchedPacket{ci: ci, lt: lt, start: start, end: len(b.data)})
		}
		select {
		case ra.full <- b:
		case <-ra.quit:
			return
		}
		if b.err != nil {
			return
		}
	}
}
