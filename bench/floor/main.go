// Command floor measures what this machine gives any server before its own code runs: an fsync
// after an idle gap against one back to back (overwriting a file, as SQLite's WAL does once it
// wraps, and appending, as the harness's raw loop and JetStream's block files do), a loopback
// TCP round trip between two processes, and a null system call. docs/benchmarks.md ("The
// machine's floor") reads it.
//
//	cd bench && go run ./floor -dir /path/on/the/disk/under/test
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"time"
)

func main() {
	dir := flag.String("dir", ".", "where the test file goes (the disk under test)")
	n := flag.Int("n", 2000, "samples per measure")
	rounds := flag.Int("rounds", 2, "rounds of every measure, interleaved")
	echo := flag.String("echo", "", "internal: serve a TCP echo on this listener address and print it")
	flag.Parse()
	if *echo != "" {
		serveEcho(*echo)
		return
	}
	spin := func(d time.Duration) {
		for t := time.Now(); time.Since(t) < d; {
		}
	}
	gaps := []struct {
		name string
		gap  func()
	}{
		{"back to back", func() {}},
		{"after a 300 us sleep", func() { time.Sleep(300 * time.Microsecond) }},
		{"after a 300 us sleep and 150 us of spinning", func() {
			time.Sleep(300 * time.Microsecond)
			spin(150 * time.Microsecond)
		}},
		{"after 300 us of spinning", func() { spin(300 * time.Microsecond) }},
	}
	addr, stop := startEcho()
	defer stop()
	for r := 0; r < *rounds; r++ {
		for _, g := range gaps {
			report("8 KiB overwrite + fsync, "+g.name, fsyncs(*dir, *n, false, g.gap))
		}
		report("8 KiB append + fsync, back to back", fsyncs(*dir, *n, true, func() {}))
		report("8 KiB append + fsync, after a 300 us sleep", fsyncs(*dir, *n, true, gaps[1].gap))
		report("128-byte TCP round trip to another process", roundTrips(addr, *n))
		ns := nullSyscalls(*n)
		slices.Sort(ns)
		fmt.Printf("%-68s p50 %5d ns\n", "a null system call (getppid)", ns[len(ns)/2].Nanoseconds())
	}
}

// fsyncs writes 8 KiB and fsyncs n times (over 64 blocks of a preallocated file, or appending),
// calling gap before each, and returns each write+fsync's duration.
func fsyncs(dir string, n int, appending bool, gap func()) []time.Duration {
	f, err := os.CreateTemp(dir, "floor-*")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const block = 8192
	if _, err := f.Write(make([]byte, 64*block)); err != nil {
		log.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, block)
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		off := int64(i%64) * block
		if appending {
			off = int64(64+i) * block
		}
		gap()
		t0 := time.Now()
		if _, err := f.WriteAt(buf, off); err != nil {
			log.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			log.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat
}

// startEcho starts this binary again as a TCP echo server and returns its address and a stop
// function. The child also exits when its stdin closes, so it never outlives this process (it
// held the caller's stdout open, and a shell waiting on it, after the report was printed).
func startEcho() (string, func()) {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(self, "-echo", "127.0.0.1:0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	var addr string
	if _, err := fmt.Fscanln(out, &addr); err != nil {
		log.Fatalf("echo server: %v", err)
	}
	return addr, func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}
}

func serveEcho(at string) {
	ln, err := net.Listen("tcp", at)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String())
	go func() { // the parent holds stdin open while it runs
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 128)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// roundTrips sends 128 bytes and reads them back n times over one connection.
func roundTrips(addr string, n int) []time.Duration {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 128)
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			log.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			log.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat
}

// nullSyscalls times n batches of 100 getppid calls and returns the time per call of each batch.
func nullSyscalls(n int) []time.Duration {
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		for j := 0; j < 100; j++ {
			syscall.Getppid()
		}
		lat = append(lat, time.Since(t0)/100)
	}
	return lat
}

func report(name string, lat []time.Duration) {
	slices.Sort(lat)
	q := func(p float64) int64 { return lat[int(float64(len(lat)-1)*p)].Microseconds() }
	fmt.Printf("%-68s p50 %5d us  p90 %5d us  p99 %5d us\n", name, q(0.5), q(0.9), q(0.99))
}
