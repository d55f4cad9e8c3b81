// Command gencap writes a synthetic TCPStore capture for benchmarks:
//
//	go run ./replay/internal/gencap/cmd/gencap -o /tmp/big.pcap -size 512
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"github.com/storeguard/storeguard/protocol"
	"github.com/storeguard/storeguard/replay/internal/gencap"
)

func main() {
	out := flag.String("o", "", "output file")
	sizeMB := flag.Int64("size", 512, "stop once this many MiB of packets are written")
	clients := flag.Int("clients", 256, "connections per round")
	ng := flag.Bool("pcapng", false, "write pcapng instead of pcap")
	gen := flag.String("generation", "G3", "wire generation of the clients")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "gencap: -o FILE is required")
		os.Exit(2)
	}
	if err := run(*out, *sizeMB<<20, *clients, *ng, *gen, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "gencap:", err)
		os.Exit(1)
	}
}

func run(path string, target int64, clients int, ng bool, genName string, seed uint64) error {
	g, err := protocol.ParseGeneration(genName)
	if err != nil || g.Auto {
		return fmt.Errorf("generation %q: want G0..G6", genName)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	format := gencap.Pcap
	if ng {
		format = gencap.Pcapng
	}
	w, err := gencap.NewWriter(bw, format, gencap.Ethernet)
	if err != nil {
		return err
	}
	if err := gencap.Traffic(w, gencap.TrafficOptions{Target: target, Clients: clients, Gen: g.Gen, Seed: seed}); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "gencap: %s: %d packets, %d MiB of packets\n", path, w.Packets, w.Bytes>>20)
	return f.Close()
}
