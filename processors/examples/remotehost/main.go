// Command remotehost runs the reference processors (guestbook, forwarder, agent, router) in a program of
// their own, mounted on an itxd over Cap'n Proto: processor-wake subscriptions placed "remote"
// and named after one of them run here. Against `make run`'s itxd:
//
//	go run ./processors/examples/remotehost --data .itx-data
//
// (--data reads the address and the project token itxd recorded; --addr and --token say them
// instead.) It reconnects on its own, with backoff, whenever the connection ends.
//
// The agent dials the LLM endpoint --agent-vendor-url names (examples.HTTPVendor: POST
// {"requestId", "prompt"} with "<the agent's stream path>#<request id>" as the Idempotency-Key
// header, answered by
// {"text"}; empty: an echo), waits --agent-hesitation after each message, and gives each request
// --agent-expiry from its message's window to settle, the vendor call included (bounded to
// what is left of it less a 5 s reserve for the settlement). bench/soak runs it this way, killed
// with SIGKILL along the way.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/processors/remote"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "remotehost:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", os.Getenv("ITX_ADDR"), "itxd address host:port (env ITX_ADDR; default: from --data)")
	token := flag.String("token", os.Getenv("ITX_TOKEN"), "project token (env ITX_TOKEN; default: from --data)")
	data := flag.String("data", ".itx-data", "itxd's data directory, whose credentials.json gives the address and token")
	name := flag.String("name", "remotehost", "the name the host is mounted under")
	names := flag.String("processors", strings.Join(examples.Names, ","), "reference processors to host, comma-separated")
	version := flag.String("version", "remotehost-1", "the host's version: a new one resets every crash-loop budget")
	vendor := flag.String("agent-vendor-url", "", "the agent's LLM endpoint: POST {requestId, prompt} answered by {text} (empty: echo)")
	hesitation := flag.Duration("agent-hesitation", time.Duration(examples.DefaultAgentConfig.HesitationMs)*time.Millisecond, "the agent's hesitation window")
	expiry := flag.Duration("agent-expiry", time.Duration(examples.DefaultAgentConfig.ExpiryMs)*time.Millisecond, "a request's lifetime from the end of its message's hesitation window, its settlement included (more than the 5 s reserve kept for the settlement)")
	flag.Parse()
	if reserve := time.Duration(examples.DefaultAgentConfig.ReserveMs) * time.Millisecond; *expiry <= reserve {
		return fmt.Errorf("--agent-expiry %v: must be more than the %v kept back to append the settlement, or no request could ever dial the vendor", *expiry, reserve)
	}
	if *addr == "" || *token == "" {
		var creds struct {
			Addr         string `json:"addr"`
			ProjectToken string `json:"projectToken"`
		}
		b, err := os.ReadFile(filepath.Join(*data, "credentials.json"))
		if err != nil {
			return fmt.Errorf("no --addr/--token and no credentials in %s: %w", *data, err)
		}
		if err := json.Unmarshal(b, &creds); err != nil {
			return err
		}
		if *addr == "" {
			*addr = creds.Addr
		}
		if *token == "" {
			*token = creds.ProjectToken
		}
	}
	host := processors.NewHost(*version)
	opts := examples.HostOptions{Agent: examples.DefaultAgentConfig}
	opts.Agent.HesitationMs = hesitation.Milliseconds()
	opts.Agent.ExpiryMs = expiry.Milliseconds()
	if *vendor != "" {
		opts.Vendor = examples.HTTPVendor{URL: *vendor}
	}
	if err := examples.AddTo(host, strings.Split(*names, ","), opts); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return remote.Run(ctx, remote.Config{Addr: *addr, Token: *token, Name: *name, Host: host,
		Logf: log.Printf, Mounted: func() { log.Printf("mounted %q on %s", *name, *addr) }})
}
