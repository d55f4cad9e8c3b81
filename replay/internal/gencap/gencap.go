// Package gencap writes synthetic TCPStore captures for replay's tests and benchmarks: TCP
// connections serialized with gopacket over a chosen link type, into pcap or pcapng.
package gencap

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// Link is the link-layer framing of every packet in a capture.
type Link int

const (
	Ethernet Link = iota
	VLAN          // Ethernet with an 802.1Q tag
	SLL           // Linux cooked capture v1 (tcpdump -i any, older libpcap)
	SLL2          // Linux cooked capture v2 (tcpdump -i any)
	Null          // BSD loopback (DLT_NULL)
	Raw           // raw IP
)

func (l Link) linkType() layers.LinkType {
	switch l {
	case SLL:
		return layers.LinkTypeLinuxSLL
	case SLL2:
		return layers.LinkTypeLinuxSLL2
	case Null:
		return layers.LinkTypeNull
	case Raw:
		return layers.LinkTypeRaw
	}
	return layers.LinkTypeEthernet
}

// Format is the capture file format.
type Format int

const (
	Pcap Format = iota
	Pcapng
)

// Flags are TCP flags.
type Flags uint8

const (
	FIN Flags = 1 << iota
	SYN
	RST
	PSH
	ACK
)

// Segment is one TCP segment of a connection.
type Segment struct {
	Seq, Ack uint32
	Flags    Flags
	Payload  []byte
}

// Writer writes packets to a capture.
type Writer struct {
	link    Link
	pw      *pcapgo.Writer
	nw      *pcapgo.NgWriter
	buf     gopacket.SerializeBuffer
	Packets int64
	Bytes   int64 // packet bytes written (without file framing)
}

// Snaplen is the snap length written in the capture header.
const Snaplen = 262144

// NewWriter writes the capture's header to w.
func NewWriter(w io.Writer, f Format, link Link) (*Writer, error) {
	cw := &Writer{link: link, buf: gopacket.NewSerializeBuffer()}
	switch f {
	case Pcap:
		cw.pw = pcapgo.NewWriterNanos(w)
		if err := cw.pw.WriteFileHeader(Snaplen, link.linkType()); err != nil {
			return nil, err
		}
	case Pcapng:
		nw, err := pcapgo.NewNgWriterInterface(w, pcapgo.NgInterface{Name: "any", LinkType: link.linkType(),
			SnapLength: Snaplen, TimestampResolution: 9}, pcapgo.DefaultNgWriterOptions)
		if err != nil {
			return nil, err
		}
		cw.nw = nw
	default:
		return nil, fmt.Errorf("format %d", f)
	}
	return cw, nil
}

// Flush writes out what a pcapng writer buffers.
func (w *Writer) Flush() error {
	if w.nw != nil {
		return w.nw.Flush()
	}
	return nil
}

// WritePacket writes raw packet bytes; capLen < len(data) cuts the packet as a snap length would.
func (w *Writer) WritePacket(t time.Time, data []byte, capLen int) error {
	ci := gopacket.CaptureInfo{Timestamp: t, CaptureLength: min(capLen, len(data)), Length: len(data)}
	w.Packets++
	w.Bytes += int64(ci.CaptureLength)
	if w.nw != nil {
		return w.nw.WritePacket(ci, data[:ci.CaptureLength])
	}
	return w.pw.WritePacket(ci, data[:ci.CaptureLength])
}

// Frame serializes one TCP segment from src to dst in the writer's link type.
func (w *Writer) Frame(src, dst netip.AddrPort, seg Segment) ([]byte, error) {
	v6 := src.Addr().Is6() && !src.Addr().Is4In6()
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()),
		Seq: seg.Seq, Ack: seg.Ack, Window: 65535,
		FIN: seg.Flags&FIN != 0, SYN: seg.Flags&SYN != 0, RST: seg.Flags&RST != 0,
		PSH: seg.Flags&PSH != 0, ACK: seg.Flags&ACK != 0}
	var ip gopacket.SerializableLayer
	ethType, family := layers.EthernetTypeIPv4, layers.ProtocolFamilyIPv4
	if v6 {
		ip6 := &layers.IPv6{Version: 6, NextHeader: layers.IPProtocolTCP, HopLimit: 64,
			SrcIP: net.IP(src.Addr().AsSlice()), DstIP: net.IP(dst.Addr().AsSlice())}
		tcp.SetNetworkLayerForChecksum(ip6)
		ip, ethType, family = ip6, layers.EthernetTypeIPv6, layers.ProtocolFamilyIPv6BSD
	} else {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP, Flags: layers.IPv4DontFragment,
			SrcIP: net.IP(src.Addr().Unmap().AsSlice()), DstIP: net.IP(dst.Addr().Unmap().AsSlice())}
		tcp.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	}
	var ls []gopacket.SerializableLayer
	mac := func(a netip.AddrPort) net.HardwareAddr {
		b := a.Addr().As16()
		return net.HardwareAddr{0x02, 0, b[12], b[13], b[14], b[15]}
	}
	switch w.link {
	case Ethernet:
		ls = append(ls, &layers.Ethernet{SrcMAC: mac(src), DstMAC: mac(dst), EthernetType: ethType})
	case VLAN:
		ls = append(ls, &layers.Ethernet{SrcMAC: mac(src), DstMAC: mac(dst), EthernetType: layers.EthernetTypeDot1Q},
			&layers.Dot1Q{VLANIdentifier: 42, Type: ethType})
	case SLL:
		ls = append(ls, &cooked{v2: false, proto: ethType, addr: mac(src)})
	case SLL2:
		ls = append(ls, &cooked{v2: true, proto: ethType, addr: mac(src)})
	case Null:
		ls = append(ls, &layers.Loopback{Family: family})
	}
	ls = append(ls, ip, tcp, gopacket.Payload(seg.Payload))
	if err := gopacket.SerializeLayers(w.buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, err
	}
	return w.buf.Bytes(), nil
}

// WriteSegment serializes and writes one segment.
func (w *Writer) WriteSegment(t time.Time, src, dst netip.AddrPort, seg Segment) error {
	b, err := w.Frame(src, dst, seg)
	if err != nil {
		return err
	}
	return w.WritePacket(t, b, len(b))
}

// cooked is a Linux SLL or SLL2 header: gopacket decodes these but cannot serialize them.
type cooked struct {
	v2    bool
	proto layers.EthernetType
	addr  net.HardwareAddr
}

func (c *cooked) LayerType() gopacket.LayerType {
	if c.v2 {
		return layers.LayerTypeLinuxSLL2
	}
	return layers.LayerTypeLinuxSLL
}

func (c *cooked) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	if c.v2 {
		h, err := b.PrependBytes(20)
		if err != nil {
			return err
		}
		clear(h)
		binary.BigEndian.PutUint16(h[0:], uint16(c.proto))
		binary.BigEndian.PutUint32(h[4:], 1) // interface index
		binary.BigEndian.PutUint16(h[8:], 1) // ARPHRD_ETHER
		h[10] = 0                            // to us
		h[11] = byte(len(c.addr))
		copy(h[12:20], c.addr)
		return nil
	}
	h, err := b.PrependBytes(16)
	if err != nil {
		return err
	}
	clear(h)
	binary.BigEndian.PutUint16(h[0:], 0) // to us
	binary.BigEndian.PutUint16(h[2:], 1) // ARPHRD_ETHER
	binary.BigEndian.PutUint16(h[4:], uint16(len(c.addr)))
	copy(h[6:14], c.addr)
	binary.BigEndian.PutUint16(h[14:], uint16(c.proto))
	return nil
}

// Conn is one TCP connection between a client and the store.
type Conn struct {
	W              *Writer
	Client, Server netip.AddrPort
	CSeq, SSeq     uint32 // next sequence number of each side
}

// Conn starts a connection with the given initial sequence numbers; nothing is written yet.
func (w *Writer) Conn(client, server netip.AddrPort, cisn, sisn uint32) *Conn {
	return &Conn{W: w, Client: client, Server: server, CSeq: cisn, SSeq: sisn}
}

// Open writes the three-way handshake, 50 µs apart.
func (c *Conn) Open(t time.Time) error {
	return c.exchange(t, SYN, Segment{Seq: c.CSeq, Flags: SYN})
}

// exchange writes first from the client (a SYN or a FIN), the store's answer with the same flag,
// and the client's last ACK, 50 µs apart; each flag takes a sequence number.
func (c *Conn) exchange(t time.Time, flag Flags, first Segment) error {
	if err := c.W.WriteSegment(t, c.Client, c.Server, first); err != nil {
		return err
	}
	c.CSeq++
	if err := c.W.WriteSegment(t.Add(50*time.Microsecond), c.Server, c.Client,
		Segment{Seq: c.SSeq, Ack: c.CSeq, Flags: flag | ACK}); err != nil {
		return err
	}
	c.SSeq++
	return c.W.WriteSegment(t.Add(100*time.Microsecond), c.Client, c.Server, Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: ACK})
}

// Segments cuts payload into client-to-server segments of at most mss bytes and advances CSeq
// past them; write them, in any order, with Write.
func (c *Conn) Segments(payload []byte, mss int) []Segment {
	var segs []Segment
	for len(payload) > 0 {
		n := min(len(payload), mss)
		segs = append(segs, Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: ACK | PSH, Payload: payload[:n]})
		c.CSeq += uint32(n)
		payload = payload[n:]
	}
	return segs
}

// Write writes client-to-server segments at time t.
func (c *Conn) Write(t time.Time, segs ...Segment) error {
	for _, s := range segs {
		if err := c.W.WriteSegment(t, c.Client, c.Server, s); err != nil {
			return err
		}
	}
	return nil
}

// Send writes payload from the client in segments of at most mss bytes at time t.
func (c *Conn) Send(t time.Time, payload []byte, mss int) error {
	return c.Write(t, c.Segments(payload, mss)...)
}

// Reply writes payload from the store in segments of at most mss bytes at time t.
func (c *Conn) Reply(t time.Time, payload []byte, mss int) error {
	for len(payload) > 0 {
		n := min(len(payload), mss)
		if err := c.W.WriteSegment(t, c.Server, c.Client,
			Segment{Seq: c.SSeq, Ack: c.CSeq, Flags: ACK | PSH, Payload: payload[:n]}); err != nil {
			return err
		}
		c.SSeq += uint32(n)
		payload = payload[n:]
	}
	return nil
}

// Close writes the client's FIN, the store's FIN and the last ACK.
func (c *Conn) Close(t time.Time) error {
	return c.exchange(t, FIN, Segment{Seq: c.CSeq, Ack: c.SSeq, Flags: FIN | ACK})
}
