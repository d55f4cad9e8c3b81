package replay

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// Capture file magics, as the first four bytes read little-endian.
const (
	magicPcapMicro   = 0xa1b2c3d4
	magicPcapNano    = 0xa1b23c4d
	magicPcapMicroBE = 0xd4c3b2a1
	magicPcapNanoBE  = 0x4d3cb2a1
	magicPcapng      = 0x0a0d0d0a
)

// ReadFile replays one capture file: pcap or pcapng, gzip-compressed or not, told apart by its
// first bytes, never by its name.
func (r *Replayer) ReadFile(ctx context.Context, name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.ReadCapture(ctx, name, f)
}

// ReadCapture replays the capture read from in; name labels its results and errors.
func (r *Replayer) ReadCapture(ctx context.Context, name string, in io.Reader) error {
	r.sum.Files++
	src, err := openSource(in)
	if err != nil {
		return &CaptureError{File: name, Offset: -1, Err: err}
	}
	c := r.newCapture(name)
	err = c.run(ctx, src)
	c.end()
	if err == nil {
		err = r.emitErr
	}
	return err
}

// packetSource is a pcap or pcapng reader.
type packetSource interface {
	// next returns the next packet; data is valid until the following call. io.EOF is a clean end.
	next() (data []byte, ci gopacket.CaptureInfo, lt layers.LinkType, err error)
	// offset is the byte offset of the record next tried to read, -1 where unknown.
	offset() int64
}

func openSource(in io.Reader) (packetSource, error) {
	size := readBufferSize(in)
	br := bufio.NewReaderSize(in, size)
	magic, err := br.Peek(4)
	if len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, gerr := gzip.NewReader(br)
		if gerr != nil {
			return nil, fmt.Errorf("gzip: %w", gerr)
		}
		br = bufio.NewReaderSize(gz, size)
		magic, err = br.Peek(4)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("not a pcap or pcapng capture: too short")
		}
		return nil, err
	}
	switch binary.LittleEndian.Uint32(magic) {
	case magicPcapMicro, magicPcapNano, magicPcapMicroBE, magicPcapNanoBE:
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("pcap header: %w", err)
		}
		if _, ok := firstLayer(pr.LinkType(), nil); !ok {
			return nil, fmt.Errorf("link type %s (%d) is not supported (want Ethernet, Linux SLL or SLL2, loopback or raw IP)",
				pr.LinkType(), int(pr.LinkType()))
		}
		return &pcapSource{r: pr, lt: pr.LinkType(), off: 24}, nil
	case magicPcapng:
		nr, err := pcapgo.NewNgReader(br, pcapgo.NgReaderOptions{WantMixedLinkType: true, SkipUnknownVersion: true})
		if err != nil {
			return nil, fmt.Errorf("pcapng header: %w", err)
		}
		return &ngSource{r: nr}, nil
	}
	return nil, fmt.Errorf("not a pcap or pcapng capture (starts with % x)", magic)
}

// readBufferSize is 1 MiB, or less for a smaller input of known size: a fuzzer's inputs, for
// one, are a few hundred bytes.
func readBufferSize(in io.Reader) int {
	const most = 1 << 20
	var size int64
	switch r := in.(type) {
	case interface{ Size() int64 }: // bytes.Reader, strings.Reader
		size = r.Size()
	case *os.File:
		fi, err := r.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return most
		}
		size = fi.Size()
	default:
		return most
	}
	return int(min(most, max(4096, size)))
}

type pcapSource struct {
	r   *pcapgo.Reader
	lt  layers.LinkType
	off int64
}

func (s *pcapSource) next() ([]byte, gopacket.CaptureInfo, layers.LinkType, error) {
	data, ci, err := s.r.ZeroCopyReadPacketData()
	if err == nil {
		s.off += 16 + int64(ci.CaptureLength)
	}
	return data, ci, s.lt, err
}

func (s *pcapSource) offset() int64 { return s.off }

type ngSource struct{ r *pcapgo.NgReader }

func (s *ngSource) next() ([]byte, gopacket.CaptureInfo, layers.LinkType, error) {
	data, ci, err := s.r.ZeroCopyReadPacketData()
	var lt layers.LinkType
	if err == nil && len(ci.AncillaryData) > 0 {
		lt, _ = ci.AncillaryData[0].(layers.LinkType)
	}
	return data, ci, lt, err
}

func (s *ngSource) offset() int64 { return -1 }

// run reads src to its end, feeding every TCP segment to a server port to the streams. A
// goroutine reads ahead (readAhead) so that file reading overlaps the streams' work.
func (c *capture) run(ctx context.Context, src packetSource) error {
	ra := startReadAhead(src)
	defer ra.stop()
	var n uint64
	for {
		b := <-ra.full
		for i := range b.pkts {
			p := &b.pkts[i]
			data := b.bytes(p)
			n++
			c.r.sum.Packets++
			c.r.sum.Bytes += uint64(len(data))
			if n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if c.r.emitErr != nil {
				return c.r.emitErr
			}
			if !c.pd.decode(data, p.lt) {
				continue
			}
			c.segment(p.ci)
		}
		if err := b.err; err != nil {
			if err == io.EOF {
				return nil
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("truncated capture: %w", err)
			}
			return &CaptureError{File: c.file, Packet: n + 1, Offset: b.errOffset, Err: err}
		}
		ra.free <- b
	}
}

// packetDecoder finds the TCP segment in a link-layer frame, without checking checksums (a
// capture on the sending host sees them before offload fills them in).
type packetDecoder struct {
	eth     layers.Ethernet
	dot1q   layers.Dot1Q
	sll     layers.LinuxSLL
	sll2    layers.LinuxSLL2
	loop    layers.Loopback
	ip4     layers.IPv4
	ip6     layers.IPv6
	tcp     layers.TCP
	parsers map[gopacket.LayerType]*gopacket.DecodingLayerParser
	first   gopacket.LayerType // of the latest packet, whose parser is parser
	parser  *gopacket.DecodingLayerParser
	decoded []gopacket.LayerType

	src, dst  netip.AddrPort
	truncated bool // the segment's payload was cut short (snap length)
}

func newPacketDecoder() *packetDecoder {
	d := &packetDecoder{parsers: map[gopacket.LayerType]*gopacket.DecodingLayerParser{}}
	// A slice indexed by layer type finds each layer's decoder faster than the default map; the
	// parsers differ only in their first layer and share it.
	dlc := gopacket.DecodingLayerContainer(gopacket.DecodingLayerSparse(nil))
	for _, dl := range []gopacket.DecodingLayer{&d.eth, &d.dot1q, &d.sll, &d.sll2, &d.loop, &d.ip4, &d.ip6, &d.tcp} {
		dlc = dlc.Put(dl)
	}
	for _, first := range []gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeLinuxSLL,
		layers.LayerTypeLinuxSLL2, layers.LayerTypeLoopback, layers.LayerTypeIPv4, layers.LayerTypeIPv6} {
		p := gopacket.NewDecodingLayerParser(first)
		p.SetDecodingLayerContainer(dlc)
		p.IgnoreUnsupported = true
		d.parsers[first] = p
	}
	return d
}

// firstLayer is the layer a frame of link type lt starts with; data (may be nil) tells raw IP's
// version.
func firstLayer(lt layers.LinkType, data []byte) (gopacket.LayerType, bool) {
	switch lt {
	case layers.LinkTypeEthernet:
		return layers.LayerTypeEthernet, true
	case layers.LinkTypeLinuxSLL:
		return layers.LayerTypeLinuxSLL, true
	case layers.LinkTypeLinuxSLL2:
		return layers.LayerTypeLinuxSLL2, true
	case layers.LinkTypeNull, layers.LinkTypeLoop:
		return layers.LayerTypeLoopback, true
	case layers.LinkTypeIPv4:
		return layers.LayerTypeIPv4, true
	case layers.LinkTypeIPv6:
		return layers.LayerTypeIPv6, true
	case layers.LinkTypeRaw, 12, 14: // 12 and 14: DLT_RAW as some systems number it
		if len(data) > 0 && data[0]>>4 == 6 {
			return layers.LayerTypeIPv6, true
		}
		return layers.LayerTypeIPv4, true
	}
	return 0, false
}

// decode reports whether data holds a TCP segment; its fields are then in d.tcp, d.src, d.dst.
func (d *packetDecoder) decode(data []byte, lt layers.LinkType) bool {
	first, ok := firstLayer(lt, data)
	if !ok {
		return false
	}
	if first != d.first { // one link type is the rule: skip the map
		d.first, d.parser = first, d.parsers[first]
	}
	p := d.parser
	if err := p.DecodeLayers(data, &d.decoded); err != nil || len(d.decoded) == 0 {
		return false
	}
	if d.decoded[len(d.decoded)-1] != layers.LayerTypeTCP {
		return false // not TCP, or an IP fragment: a fragmented segment becomes a gap
	}
	var src, dst netip.Addr
	switch d.decoded[len(d.decoded)-2] {
	case layers.LayerTypeIPv4:
		src, _ = netip.AddrFromSlice(d.ip4.SrcIP)
		dst, _ = netip.AddrFromSlice(d.ip4.DstIP)
	case layers.LayerTypeIPv6:
		src, _ = netip.AddrFromSlice(d.ip6.SrcIP)
		dst, _ = netip.AddrFromSlice(d.ip6.DstIP)
	default:
		return false
	}
	d.src = netip.AddrPortFrom(src, uint16(d.tcp.SrcPort))
	d.dst = netip.AddrPortFrom(dst, uint16(d.tcp.DstPort))
	d.truncated = p.Truncated
	return true
}
