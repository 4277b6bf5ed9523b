// Command itxd serves durable event streams as a Cap'n Proto capability graph.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/capability"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/examples"
	"github.com/itx-dev/itx/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"golang.org/x/net/netutil"
	"golang.org/x/term"
)

// init keeps the main goroutine on the process's main thread and every other goroutine off it.
// Linux hands a signal sent to the process (SIGTERM, SIGINT) to the main thread first; when a
// goroutine stuck in a disk syscall (an fsync the disk does not answer, in uninterruptible
// sleep) ran there, the signal stayed pending until that syscall returned, so a SIGTERM during
// a hung commit was not heard at all (seen: main thread in request_wait_answer, SIGTERM in the
// shared pending set, the other threads asleep). Locked here, the main thread only ever waits
// in main, asleep in the runtime, and takes the signal at once.
func init() { runtime.LockOSThread() }

func main() {
	if err := run(); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // --help, -h
		}
		var logged loggedError
		if errors.As(err, &logged) {
			os.Exit(1) // its log line said it, in the log's format
		}
		if jsonLog != nil {
			// Past the flags, with --log-format json: one JSON line like every other.
			jsonLog.Error().Err(err).Msg("itxd stopped")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "itxd:", err)
		var usage usageError
		if errors.As(err, &usage) {
			fmt.Fprintln(os.Stderr, "run itxd --help for the flags")
			os.Exit(2) // as the flag package exits for a flag that does not parse
		}
		os.Exit(1)
	}
}

// printHelp is --help: what itxd is, how it stops and exits, then the flags.
func printHelp(fs *flag.FlagSet) {
	fmt.Fprint(os.Stderr, `Usage: itxd [flags]

itxd serves durable event streams over Cap'n Proto RPC from one data directory (--data); on its
first start it creates the default project and the deployment root, and records their tokens in
<data>/credentials.json. SIGTERM or SIGINT stops it: it stops accepting, lets in-flight calls
finish (within --shutdown-timeout), closes the databases and exits 0. A flag value it cannot
honor is refused before anything starts, with exit status 2; any other failure exits 1.

Flags (--name value or --name=value; a number or duration flag ends with the range it takes):
`)
	fs.SetOutput(os.Stderr)
	fs.PrintDefaults()
}

// loggedError is a failure run already logged.
type loggedError struct{ error }

// jsonLog is itxd's logger once run has made it under --log-format json: main logs a failure
// run returns through it, so a log collector reading JSON lines gets one (it got a plain
// "itxd: ..." line).
var jsonLog *zerolog.Logger

// usageError is a flag value or combination itxd refuses before it starts anything.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// flagRange is what one number or duration flag takes: min to max (max 0: no upper bound), and
// the special values below min its help names: zero (what 0 means; "": 0 is refused) and, for
// --min-free-disk-bytes, minusOne. A bound of 0 or less used to be replaced by its default in
// silence, and one above 0 that cannot work was taken: --idle-timeout 1ns swept the streams in
// a busy loop, --rpc-max-message-bytes 10 aborted every login, --jsonata-concurrency 1e18
// crashed at start.
type flagRange struct {
	min, max       int64
	zero, minusOne string
}

// The ranges of itxd's numeric flags; checkFlags refuses a number or duration flag missing here.
// A minimum refuses only what leaves itxd unable to serve anyone: a message or reply bound below
// what a login needs, too few capabilities or unfinished replies for a client's first calls, a
// sweep that is a busy loop, a drain with no time to run. A bound set so low that requests are
// refused by it (a tiny JSONata step budget, a quota no stream fits) is the bound doing its
// job, and is taken: it is how the bound is tried.
var flagRanges = map[string]flagRange{
	"metrics-max-connections":           {min: 1},
	"idle-timeout":                      {min: int64(time.Millisecond)},
	"max-loaded-streams":                {min: 1},
	"backup-every":                      {min: int64(time.Minute), zero: "never"}, // server.BackupSchedule refuses less
	"backup-keep":                       {min: 1, max: server.MaxBackupKeep},
	"webhook-max-in-flight":             {min: 1},
	"webhook-max-in-flight-per-project": {min: 1, zero: "three quarters of --webhook-max-in-flight"},
	"max-held-streams-per-project":      {min: 1, zero: "three quarters of --max-held-streams"},
	"max-live-per-project":              {min: 1, zero: "three quarters of --max-live"},
	"webhook-max-response-header-bytes": {min: 1},
	"max-held-streams":                  {min: 1, zero: "from the open-file limit"},
	"breaker-burst":                     {min: 1, zero: "100000"},
	"breaker-refill-per-minute":         {min: 1, zero: "6000000"},
	"max-connections-per-stream":        {min: 1, zero: "16384"},
	"max-readers-per-stream":            {min: 1, zero: "1024"},
	"max-scheduled-per-stream":          {min: 1, zero: "10000"},
	"max-mounts-per-project":            {min: 1, zero: "4096"},
	"max-host-contract-bytes":           {min: 1},
	"max-tokens-per-project":            {min: 1, zero: "10000"},
	"max-secrets-per-project":           {min: 1, zero: "10000"},
	"max-streams-per-project":           {min: 1, zero: "100000"},
	"max-subscription-config-bytes":     {min: 1},
	"max-live-subscribers-per-stream":   {min: 1, zero: "1024"},
	"max-live-per-login":                {min: 1, zero: "4096"},
	"max-live":                          {min: 1, zero: "65536"},
	"max-subscriptions-per-stream":      {min: 1},
	"max-project-bytes":                 {min: 1, zero: "no quota"}, // below ~128 KiB (a stream with its write-ahead log) every new stream is refused
	"min-free-disk-bytes":               {min: 1, zero: "the default", minusOne: "none"},
	"max-ephemeral-bytes-per-stream":    {min: 1},
	"max-processor-kv-keys":             {min: 1},
	"max-processor-kv-bytes":            {min: 1},
	"rpc-max-calls":                     {min: 1},
	"rpc-max-reply-bytes":               {min: 1},
	"rpc-preauth-max-calls":             {min: 1},
	"rpc-preauth-max-reply-bytes":       {min: 1},
	"rpc-global-max-calls":              {min: 1},
	"rpc-global-max-reply-bytes":        {min: 1},
	// A login is one message of about 200 bytes (a token is 52); its reply holds the project's
	// capability until the client's Finish.
	"rpc-max-message-bytes":                  {min: 1 << 10},
	"rpc-preauth-max-message-bytes":          {min: 1 << 10},
	"rpc-max-call-bytes":                     {min: 1},
	"rpc-global-max-call-bytes":              {min: 1},
	"rpc-max-unfinished-replies":             {min: 8}, // Go clients finish 250 ms after the reply: they need about 16
	"rpc-max-unfinished-reply-bytes":         {min: 1 << 10},
	"rpc-preauth-max-unfinished-replies":     {min: 1},
	"rpc-preauth-max-unfinished-reply-bytes": {min: 1 << 10},
	// A session holds the gateway, its project and the streams it works on.
	"rpc-max-capabilities":                    {min: 8},
	"rpc-max-unreturned-calls":                {min: 1},
	"rpc-global-max-capabilities":             {min: 8},
	"rpc-global-max-unreturned-calls":         {min: 1},
	"rpc-max-connections":                     {min: 1},
	"rpc-preauth-max-connections-per-address": {min: 1},
	"rpc-preauth-max-connections":             {min: 1, zero: "a quarter of --rpc-max-connections, at least 64"},
	"rpc-max-connections-per-project":         {min: 1, zero: "three quarters of --rpc-max-connections"},
	"rpc-login-timeout":                       {min: int64(10 * time.Millisecond)},
	"rpc-max-logins-per-connection":           {min: 1},
	"rpc-max-push-bytes":                      {min: 1},
	// The kernel's granularity, and Linux's largest TCP_KEEPIDLE (32767 s).
	"rpc-keepalive":              {min: int64(time.Second), max: int64(32767 * time.Second)},
	"jsonata-max-items":          {min: 1},
	"jsonata-max-bytes":          {min: 1},
	"jsonata-concurrency":        {min: 1, max: 65536, zero: "one per core"},
	"jsonata-max-steps":          {min: 1},
	"jsonata-timeout":            {min: int64(time.Millisecond)},
	"jsonata-max-compiled-bytes": {min: 1},
	"shutdown-timeout":           {min: int64(100 * time.Millisecond)},
	"agent-hesitation":           {min: 0}, // 0: do not wait
}

// checkFlags refuses values no flag means (a number or duration out of its range, naming the
// flag, the value and the range), and extra arguments.
func checkFlags(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q: itxd takes only flags", fs.Arg(0))
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok || err != nil {
			return
		}
		n, isDuration, numeric := numberOf(g)
		if !numeric {
			return
		}
		r, ok := flagRanges[f.Name]
		if !ok {
			err = fmt.Errorf("--%s has no range in flagRanges", f.Name)
			return
		}
		if (n == 0 && r.zero != "") || (n == -1 && r.minusOne != "") || (n >= r.min && (r.max == 0 || n <= r.max)) {
			return
		}
		err = usagef("--%s %s is out of range: want %s", f.Name, f.Value, r.text(isDuration))
	})
	return err
}

// numberOf reads a number or duration flag's value.
func numberOf(g flag.Getter) (n int64, isDuration, ok bool) {
	switch v := g.Get().(type) {
	case int:
		return int64(v), false, true
	case int64:
		return v, false, true
	case time.Duration:
		return int64(v), true, true
	}
	return 0, false, false
}

// text says what r takes: "-1 (none), 0 (the default) or 1 or more", "1s to 9h6m7s".
func (r flagRange) text(isDuration bool) string {
	show := func(v int64) string {
		if isDuration {
			return time.Duration(v).String()
		}
		return fmt.Sprint(v)
	}
	want := show(r.min) + " or more"
	if r.max != 0 {
		want = show(r.min) + " to " + show(r.max)
	}
	if r.zero != "" {
		want = fmt.Sprintf("0 (%s) or %s", r.zero, want)
	}
	if r.minusOne != "" {
		want = fmt.Sprintf("-1 (%s), %s", r.minusOne, want)
	}
	return want
}

// showRanges ends each number or duration flag's help with the range it takes, so that --help
// says what checkFlags refuses.
func showRanges(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		g, ok := f.Value.(flag.Getter)
		if !ok {
			return
		}
		if _, isDuration, numeric := numberOf(g); numeric {
			if r, ok := flagRanges[f.Name]; ok {
				f.Usage += " [takes " + r.text(isDuration) + "]"
			}
		}
	})
}

func run() error {
	// Errors are printed by main, once: the flag package printed a value that does not parse
	// followed by the whole help (150 lines, the error at their top), and other refusals by a line.
	flag.CommandLine.Init("itxd", flag.ContinueOnError)
	flag.CommandLine.SetOutput(io.Discard)
	listen := flag.String("listen", "127.0.0.1:7878", "TCP address for Cap'n Proto RPC; off loopback it needs --tls-cert and --tls-key, or --insecure")
	data := flag.String("data", ".itx-data", "data directory (created 0700 if missing); one itxd at a time serves it (it holds <data>/itxd.lock)")
	logLevel := flag.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := flag.String("log-format", "console", "log format: console or json")
	metricsAddr := flag.String("metrics", "", "address for Prometheus /metrics over HTTP, with /healthz (liveness) and /readyz (readiness) (empty: off)")
	metricsConns := flag.Int("metrics-max-connections", 64, "HTTP connections the --metrics address serves at once; more wait, unaccepted, until one ends (a request's header must arrive within 10s, an idle connection ends after 1m)")
	pprofOn := flag.Bool("pprof", false, "also serve Go's profiler at /debug/pprof/ on the --metrics address (keep that address private)")
	addrFile := flag.String("addr-file", "", "write the bound RPC address here once listening")
	idle := flag.Duration("idle-timeout", 5*time.Minute, "unload a stream nobody has used for this long")
	maxLoaded := flag.Int("max-loaded-streams", 1024, "unload least recently used idle streams above this many; at most --max-held-streams (left at its default, it is lowered to a smaller --max-held-streams)")
	backupDir := flag.String("backup-dir", "", "write a backup of the data directory here (an absolute path that exists, outside the data directory) every --backup-every, named itx-backup-<UTC time>")
	backupEvery := flag.Duration("backup-every", 0, "how often to write a scheduled backup into --backup-dir (0: never); the first is due this long after the newest one there")
	backupKeep := flag.Int("backup-keep", server.DefaultBackupKeep, "scheduled backups kept in --backup-dir; older ones are deleted after each new one")
	maxWebhooks := flag.Int("webhook-max-in-flight", 1024, "webhook requests open at once over all subscriptions; a delivery waits for one before its delivery timeout starts")
	maxWebhooksShare := flag.Int("webhook-max-in-flight-per-project", 0, "webhook requests one project's subscriptions have open at once, its share of --webhook-max-in-flight (0: three quarters of it)")
	webhookHeader := flag.Int64("webhook-max-response-header-bytes", server.DefaultMaxWebhookResponseHeaderBytes, "bytes of a webhook answer's status line and header fields itxd reads; a longer header fails the delivery, retried as an outage")
	maxHeldShare := flag.Int("max-held-streams-per-project", 0, "streams of one project held in use at once, its share of --max-held-streams; a call of that project needing one more fails with limitExceeded (0: three quarters of it)")
	maxHeld := flag.Int("max-held-streams", 0, "streams loaded at once, in use or not; a call needing one more fails with limitExceeded (0: from the open-file limit, (RLIMIT_NOFILE - 1024 - --rpc-max-connections - --webhook-max-in-flight - --metrics-max-connections) / 8, between 256 and 16384)")
	burst := flag.Int("breaker-burst", 0, "circuit breaker burst per stream, in events (0: 100000)")
	refill := flag.Int("breaker-refill-per-minute", 0, "circuit breaker refill per stream per minute (0: 6000000)")
	denyPrivate := flag.Bool("webhook-deny-private", false, "refuse webhook destinations that are not global unicast addresses (loopback, private, link-local, shared, documentation, multicast and the other special-purpose blocks), checked at configure, before each request and on the address dialled")
	var allowHosts hostList
	flag.Var(&allowHosts, "webhook-allow-host", "allow webhooks only to this `host` (repeatable; \"*.example.com\" matches subdomains; none given: any host)")
	maxConns := flag.Int("max-connections-per-stream", 0, "open connections one stream serves at most (0: 16384)")
	maxReaders := flag.Int("max-readers-per-stream", 0, "registered readers one stream holds at most (0: 1024)")
	maxScheduled := flag.Int("max-scheduled-per-stream", 0, "pending scheduled appends (Stream.schedule) one stream holds at most (0: 10000)")
	maxMounts := flag.Int("max-mounts-per-project", 0, "capabilities one project may have mounted under names, and separately processor hosts (0: 4096)")
	maxHostContracts := flag.Int("max-host-contract-bytes", server.DefaultMaxHostContractBytes, "bytes of the contracts one processor host announces (names, reducer versions, consumed types, each counted with 24 bytes more), kept for its mount's life; more is refused with tooLarge")
	maxTokens := flag.Int("max-tokens-per-project", 0, "tokens one project may hold; creating one more fails with limitExceeded (0: 10000)")
	maxSecrets := flag.Int("max-secrets-per-project", 0, "distinct webhook secrets one project's subscriptions may reference; configuring one more fails with limitExceeded (0: 10000)")
	maxStreams := flag.Int("max-streams-per-project", 0, "streams one project may hold (each a database file); the append that would create one more fails with limitExceeded (0: 100000)")
	maxConfig := flag.Int("max-subscription-config-bytes", itx.MaxSubscriptionConfigBytes, "bytes of one subscription's config (its configured event's payload), kept in memory while its stream is loaded; a larger one is refused with tooLarge")
	maxLive := flag.Int("max-live-subscribers-per-stream", 0, "live-state subscribers one stream serves at most, connections' state frames not counted (0: 1024)")
	maxLivePerLogin := flag.Int("max-live-per-login", 0, "live connections and live-state views one login holds open, on any streams (0: 4096)")
	maxLiveAll := flag.Int("max-live", 0, "live connections and live-state views open at once over all logins (0: 65536)")
	maxLiveShare := flag.Int("max-live-per-project", 0, "live connections and live-state views one project's logins hold open at once, its share of --max-live (0: three quarters of it)")
	maxSubs := flag.Int("max-subscriptions-per-stream", itx.MaxSubscriptionsPerStream, "subscriptions one stream holds at most; configuring one more fails with limitExceeded")
	maxProjectBytes := flag.Int64("max-project-bytes", 0, "disk one project's streams may take (their files, as itx du counts them); past it appends that add events to them (and processor KV puts that grow their KV) are refused with resourceExhausted (0: no quota)")
	minFree := flag.Int64("min-free-disk-bytes", 0, "bytes kept free on the data directory's file system: while less is free, appends that add events (and new subscriptions, new scheduled appends and processor KV puts that grow it) are refused with resourceExhausted, so deleting and trimming streams still work (0: a hundredth of the file system, at most 256 MiB; -1: none)")
	ephBytes := flag.Int64("max-ephemeral-bytes-per-stream", itx.EphemeralBufferBytes, "bytes of ephemeral events (type, payload, metadata) one stream keeps; past it the oldest are evicted first")
	kvKeys := flag.Int("max-processor-kv-keys", server.DefaultMaxProcessorKVKeys, "keys of one stream's processor KV (in-process and remote processors together); a put of one more fails with limitExceeded")
	kvBytes := flag.Int64("max-processor-kv-bytes", server.DefaultMaxProcessorKVBytes, "bytes of keys and values in one stream's processor KV; a put growing it past this fails with limitExceeded")
	var flow flowconn.Limits
	flag.IntVar(&flow.Calls, "rpc-max-calls", flowconn.DefaultCalls, "calls in flight per logged-in connection; above it the server stops reading that connection")
	flag.Int64Var(&flow.Bytes, "rpc-max-reply-bytes", flowconn.DefaultBytes, "reply bytes waiting to be written per logged-in connection; above it the server stops reading that connection, and a read waits to build its reply")
	flag.IntVar(&flow.PreAuthCalls, "rpc-preauth-max-calls", flowconn.DefaultPreAuthCalls, "calls in flight per connection before login")
	flag.Int64Var(&flow.PreAuthBytes, "rpc-preauth-max-reply-bytes", flowconn.DefaultPreAuthBytes, "reply bytes waiting to be written per connection before login")
	flag.IntVar(&flow.GlobalCalls, "rpc-global-max-calls", flowconn.DefaultGlobalCalls, "calls in flight over all connections")
	flag.Int64Var(&flow.GlobalBytes, "rpc-global-max-reply-bytes", flowconn.DefaultGlobalBytes, "reply bytes waiting to be written over all connections")
	flag.Int64Var(&flow.MaxMessage, "rpc-max-message-bytes", flowconn.DefaultMaxMessage, "largest message a logged-in connection may send; a larger one aborts the connection with limitExceeded before it is read")
	flag.Int64Var(&flow.PreAuthMaxMessage, "rpc-preauth-max-message-bytes", flowconn.DefaultPreAuthMaxMessage, "largest message a connection may send before login")
	flag.Int64Var(&flow.CallBytes, "rpc-max-call-bytes", flowconn.DefaultCallBytes, "encoded bytes of the calls a logged-in connection has in flight (read, not yet answered); above it the server stops reading that connection")
	flag.Int64Var(&flow.GlobalCallBytes, "rpc-global-max-call-bytes", flowconn.DefaultGlobalCallBytes, "encoded bytes of the calls in flight over all connections")
	flag.IntVar(&flow.Unfinished, "rpc-max-unfinished-replies", flowconn.DefaultUnfinished, "replies a logged-in client has not finished (Cap'n Proto Finish); above it the connection is aborted with limitExceeded")
	flag.Int64Var(&flow.UnfinishedBytes, "rpc-max-unfinished-reply-bytes", flowconn.DefaultUnfinishedBytes, "encoded bytes of the replies a logged-in client has not finished; above it the connection is aborted")
	flag.IntVar(&flow.PreAuthUnfinished, "rpc-preauth-max-unfinished-replies", flowconn.DefaultPreAuthUnfinished, "replies a client has not finished, before login")
	flag.Int64Var(&flow.PreAuthUnfinishedBytes, "rpc-preauth-max-unfinished-reply-bytes", flowconn.DefaultPreAuthUnfinishedBytes, "bytes of the replies a client has not finished, before login")
	flag.IntVar(&flow.Capabilities, "rpc-max-capabilities", flowconn.DefaultCapabilities, "capabilities one connection's client holds without releasing them; above it the connection is aborted")
	flag.IntVar(&flow.Unreturned, "rpc-max-unreturned-calls", flowconn.DefaultUnreturned, "calls itxd made on one connection's capabilities (EventSinks, LiveSubscribers, Receivers, processor hosts) that its client has not returned, also cancelled ones; above it the connection is aborted")
	flag.IntVar(&flow.GlobalCapabilities, "rpc-global-max-capabilities", flowconn.DefaultGlobalCapabilities, "capabilities clients hold without releasing them, over all connections; above it the connection holding the most is aborted")
	flag.IntVar(&flow.GlobalUnreturned, "rpc-global-max-unreturned-calls", flowconn.DefaultGlobalUnreturned, "calls itxd made on clients' capabilities that they have not returned, over all connections; above it the connection holding the most is aborted")
	flag.IntVar(&flow.Connections, "rpc-max-connections", flowconn.DefaultConnections, "RPC connections open at once; one more is refused with an Abort saying so")
	flag.IntVar(&flow.PreAuthConnsPerAddress, "rpc-preauth-max-connections-per-address", flowconn.DefaultPreAuthConnsPerAddress, "RPC connections not logged in yet from one remote address (an IPv4 address or an IPv6 /64; loopback not counted); one more is refused with an Abort saying so (behind a proxy on another machine every client has its address: raise it to --rpc-max-connections)")
	flag.IntVar(&flow.PreAuthConnections, "rpc-preauth-max-connections", 0, "RPC connections not logged in yet over all addresses; one more closes the oldest of them with an Abort saying so (0: a quarter of --rpc-max-connections, at least 64 or all of it)")
	connShare := flag.Int("rpc-max-connections-per-project", 0, "RPC connections logged in to one project at once, its share of --rpc-max-connections; a login of one more is refused with limitExceeded (0: three quarters of it)")
	flag.DurationVar(&flow.LoginTimeout, "rpc-login-timeout", flowconn.DefaultLoginTimeout, "a connection that has not logged in by then is aborted")
	maxLogins := flag.Int("rpc-max-logins-per-connection", capability.DefaultMaxLoginsPerConnection, "distinct tokens one connection logs in with (logging in again with one of them shares its session); one more is refused with limitExceeded")
	pushBytes := flag.Int64("rpc-max-push-bytes", capability.DefaultPushFlowLimit, "bytes itxd has in flight toward one capability a client handed it (an EventSink, a LiveSubscriber, a mounted Receiver, a processor host); a larger message waits until the others are answered, then goes alone")
	keepAlive := flag.Duration("rpc-keepalive", capability.DefaultKeepAlive, "TCP keepalive of RPC connections: a silent connection is probed after this long and then this often; 3 unanswered probes, or writes unacknowledged for 4x this long, end it (and its mounts)")
	jsonataItems := flag.Int64("jsonata-max-items", itx.MaxJSONataItems, "array items and object entries one JSONata evaluation may build in total")
	jsonataBytes := flag.Int64("jsonata-max-bytes", itx.MaxJSONataBytes, "string bytes one JSONata evaluation may build in total")
	jsonataConcurrent := flag.Int("jsonata-concurrency", 0, "JSONata evaluations running at once (0: one per core)")
	jsonataSteps := flag.Int64("jsonata-max-steps", server.DefaultJSONataSteps, "expression nodes one JSONata evaluation may evaluate")
	jsonataTimeout := flag.Duration("jsonata-timeout", server.DefaultJSONataTimeout, "wall-clock time one JSONata evaluation may take")
	jsonataCompiled := flag.Int64("jsonata-max-compiled-bytes", server.DefaultJSONataCompiledBytes, "compiled JSONata expressions (subscriptions' conditions and transforms, barriers' where) kept in memory over all streams, estimated at 32 bytes per byte of text; the least recently used are dropped and compiled again on their next use")
	tlsCert := flag.String("tls-cert", "", "serve RPC over TLS with this certificate (PEM; with --tls-key)")
	tlsKey := flag.String("tls-key", "", "the TLS certificate's private key (PEM)")
	tlsClientCA := flag.String("tls-client-ca", "", "mutual TLS: require client certificates signed by a CA in this PEM file")
	insecure := flag.Bool("insecure", false, "allow plaintext RPC on a non-loopback address (tokens cross the network in clear)")
	shutdownTimeout := flag.Duration("shutdown-timeout", 30*time.Second, "how long SIGTERM (or SIGINT) waits for in-flight calls; past it itxd closes the streams under them, logs which were held and exits 1 (a second signal exits at once)")
	procNames := flag.String("processors", strings.Join(examples.Names, ","), "reference processors hosted in-process, comma-separated (empty: none); a processor-wake subscription named after one runs it")
	agentVendor := flag.String("agent-vendor-url", "", "the agent processor's LLM endpoint: POST {requestId, prompt} answered by {text} (empty: echo the prompt)")
	agentHesitation := flag.Duration("agent-hesitation", time.Duration(examples.DefaultAgentConfig.HesitationMs)*time.Millisecond, "how long the agent waits after a message before it requests a completion (0: not at all)")
	newRootToken := flag.Bool("new-deployment-token", false, "create a new token for the deployment root, record it in <data>/credentials.json and print it, then exit without serving (itxd must not be running on --data): for a lost credentials file, or after revoking the root's tokens")
	showRanges(flag.CommandLine)
	if err := flag.CommandLine.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(flag.CommandLine)
			return err
		}
		return usagef("%v", err)
	}
	if err := checkFlags(flag.CommandLine); err != nil {
		return err
	}
	if *pprofOn && *metricsAddr == "" {
		return usagef("--pprof serves on the --metrics address: set --metrics too")
	}
	if *logFormat != "console" && *logFormat != "json" {
		return usagef("--log-format must be console or json (got %q)", *logFormat)
	}
	// zerolog knows more names (trace, fatal, panic, disabled, and "" for no level at all):
	// the help and README name these four, so only they are taken.
	level, err := zerolog.ParseLevel(*logLevel)
	if err != nil || (level != zerolog.DebugLevel && level != zerolog.InfoLevel && level != zerolog.WarnLevel && level != zerolog.ErrorLevel) {
		return usagef("--log-level %q: want debug, info, warn or error", *logLevel)
	}

	var tlsConfig *tls.Config
	switch {
	case *tlsCert != "" || *tlsKey != "":
		if *tlsCert == "" || *tlsKey == "" {
			return usagef("--tls-cert and --tls-key go together")
		}
		cfg, err := capability.ServerTLSConfig(*tlsCert, *tlsKey, *tlsClientCA)
		if err != nil {
			return err
		}
		tlsConfig = cfg
	case *tlsClientCA != "":
		return usagef("--tls-client-ca needs --tls-cert and --tls-key")
	case !capability.IsLoopback(*listen) && !*insecure:
		return usagef("refusing to serve plaintext RPC on %s, which is not a loopback address: tokens would cross the network in clear; "+
			"give --tls-cert and --tls-key, or --insecure", *listen)
	}

	minFreeDisk := *minFree // server.Config: negative is the default, 0 none
	switch minFreeDisk {
	case 0:
		minFreeDisk = -1
	case -1:
		minFreeDisk = 0
	}

	setFlags := map[string]bool{} // the flags given, not left at their defaults
	flag.Visit(func(f *flag.Flag) { setFlags[f.Name] = true })
	if setFlags["backup-keep"] && *backupDir == "" {
		// It was taken and did nothing: an operator who meant to keep 30 backups, and forgot
		// the folder, had none.
		return usagef("--backup-keep needs --backup-dir and --backup-every (it bounds the scheduled backups)")
	}
	if err := server.CheckBackupSchedule(*data, *backupDir, *backupEvery, *backupKeep); err != nil {
		return usagef("--backup-dir, --backup-every, --backup-keep: %v", err)
	}

	var log zerolog.Logger
	if *logFormat == "json" {
		log = zerolog.New(os.Stderr)
	} else {
		// Colors only on a terminal: a log redirected to a file or a pipe (systemd, make run >
		// log, a test reading it) kept the escape codes, which split every key=value in two for
		// grep and showed as noise in a pager. NO_COLOR turns them off on a terminal too.
		noColor := !term.IsTerminal(int(os.Stderr.Fd())) || os.Getenv("NO_COLOR") != ""
		log = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly, NoColor: noColor})
	}
	log = log.Level(level).With().Timestamp().Logger()
	if *logFormat == "json" {
		jsonLog = &log
	}

	server.SetJSONataBudget(server.JSONataBudget{MaxItems: *jsonataItems, MaxBytes: *jsonataBytes,
		MaxSteps: *jsonataSteps, Timeout: *jsonataTimeout, Concurrency: *jsonataConcurrent, MaxCompiledBytes: *jsonataCompiled})
	host := processors.NewHost(capability.Version)
	agentCfg := examples.DefaultAgentConfig
	agentCfg.HesitationMs = agentHesitation.Milliseconds()
	var vendor examples.Vendor = examples.EchoVendor{}
	if *agentVendor != "" {
		vendor = examples.HTTPVendor{URL: *agentVendor}
	}
	if err := examples.AddTo(host, strings.Split(*procNames, ","), examples.HostOptions{Vendor: vendor, Agent: agentCfg}); err != nil {
		return usagef("--processors: %v", err)
	}
	if len(host.Contracts()) > 0 && *idle < processors.KeepaliveLead {
		// Taken (a short idle timeout is a legitimate test of eviction), but said: what keeps a
		// stream loaded while its processors' work runs is the keepalive's busy fire every lead
		// interval. Under it the sweep unloads the stream between two fires, cancelling the work,
		// and work longer than the idle timeout is cancelled again after every revival.
		log.Warn().Dur("idleTimeout", *idle).Dur("keepaliveLead", processors.KeepaliveLead).
			Msg("--idle-timeout is under the processors' keepalive lead: a stream can unload while its in-process processors' work runs, which cancels it, and work that takes longer than the idle timeout never finishes")
	}
	if *newRootToken {
		return mintDeploymentToken(log, *data)
	}
	if *connShare == 0 {
		*connShare = server.DefaultShare(flow.Connections)
	}
	sockets := int64(flow.Connections) + int64(*maxWebhooks) + int64(*metricsConns)
	held := heldStreams(*maxHeld, sockets)
	if limit := openFileLimit(); setFlags["max-held-streams"] && limit >= 0 && int64(held) > (limit-1024-sockets)/8 {
		// Taken as given (the operator may raise the limit under a running service manager's
		// own accounting), but said at once rather than found as "too many open files" later.
		log.Warn().Int("maxHeldStreams", held).Int64("openFileLimit", limit).Int64("fitsTheLimit", max((limit-1024-sockets)/8, 0)).
			Msg("--max-held-streams is above what the open-file limit leaves room for (about 8 descriptors per loaded stream, beside the sockets the other bounds allow): loads past that may fail with 'too many open files'; raise the limit (ulimit -n) or lower the flag")
	}
	if loaded := setFlags["max-loaded-streams"]; loaded && *maxLoaded > held {
		// --max-held-streams bounds the loaded streams, idle ones too: a larger
		// --max-loaded-streams would be ignored in silence.
		if setFlags["max-held-streams"] {
			return usagef("--max-loaded-streams %d is above --max-held-streams %d, which bounds every loaded stream, idle ones too: lower --max-loaded-streams or raise --max-held-streams", *maxLoaded, held)
		}
		return usagef("--max-loaded-streams %d is above --max-held-streams, which the open-file limit of %d makes %d here (it bounds every loaded stream, idle ones too): raise the limit (ulimit -n), set --max-held-streams, or lower --max-loaded-streams", *maxLoaded, openFileLimit(), held)
	}
	// Bound before the data directory is opened: an address that cannot be listened on is
	// refused before anything is written (and before the directory is left open unclosed).
	// The RPC address was bound after: --listen 127.0.0.1:99999 initialized a new data
	// directory, then failed with "listen tcp: address 99999: invalid port", naming no flag.
	// Connections that arrive before the server opened wait in the listen backlog.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	defer ln.Close()
	var mln net.Listener
	if *metricsAddr != "" {
		if mln, err = net.Listen("tcp", *metricsAddr); err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
	}
	ctx := context.Background()
	srv, err := server.Open(ctx, server.Config{
		DataDir: *data, Log: log, IdleTimeout: *idle, MaxLoadedStreams: *maxLoaded,
		BackupDir: *backupDir, BackupEvery: *backupEvery, BackupKeep: *backupKeep, MaxHeldStreams: held, MaxHeldStreamsPerProject: *maxHeldShare, MaxWebhooksInFlight: *maxWebhooks, MaxWebhooksInFlightPerProject: *maxWebhooksShare, MaxWebhookResponseHeaderBytes: *webhookHeader,
		BreakerBurst: *burst, BreakerRefillPerMinute: *refill,
		MaxConnectionsPerStream: *maxConns, MaxLiveSubscribersPerStream: *maxLive, MaxLivePerSession: *maxLivePerLogin, MaxLive: *maxLiveAll, MaxLivePerProject: *maxLiveShare, MaxRPCConnectionsPerProject: *connShare, MaxSubscriptionConfigBytes: *maxConfig, MaxHostContractBytes: *maxHostContracts, MaxMountsPerProject: *maxMounts, MaxReadersPerStream: *maxReaders, MaxScheduledPerStream: *maxScheduled,
		MaxStreamsPerProject: *maxStreams,
		MaxSubscriptions:     *maxSubs, EphemeralBufferBytes: *ephBytes,
		MaxProcessorKVKeys: *kvKeys, MaxProcessorKVBytes: *kvBytes,
		MaxTokensPerProject:  *maxTokens,
		MaxSecretsPerProject: *maxSecrets,
		MinFreeDisk:          minFreeDisk,
		MaxProjectBytes:      *maxProjectBytes,
		Egress:               server.EgressPolicy{AllowHosts: allowHosts, DenyPrivate: *denyPrivate},
		Processors:           host,
	})
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	listener := capability.NewListenerWithLimits(srv, flow)
	listener.SetKeepAlive(*keepAlive)
	listener.SetMaxLoginsPerConnection(*maxLogins)
	capability.SetPushFlowLimit(*pushBytes)
	registerFlowMetrics(srv.Metrics().Registry, listener.Flow())

	var serving atomic.Bool // the RPC listener is accepting
	metricsBound := ""      // the address /metrics is served on (a :0 port resolved)
	if *metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(srv.Metrics().Registry, promhttp.HandlerOpts{}))
		mux.Handle("/healthz", healthz())
		mux.Handle("/readyz", readyz(srv, &serving))
		if *pprofOn {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		// Served before the RPC address is announced: whoever reads the address file can scrape.
		metricsBound = mln.Addr().String()
		go func() {
			// Bounded like the RPC listener: peers that connect and never finish a request (or
			// never close) held a goroutine and a file descriptor each, without limit, and the
			// descriptors are the ones the RPC listener and the streams' databases need.
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
			if err := hs.Serve(netutil.LimitListener(mln, *metricsConns)); err != nil {
				log.Error().Err(err).Msg("metrics server stopped")
			}
		}()
	}

	// Caught from before the address is announced: a SIGTERM sent as soon as itxd listens (an
	// orchestrator, a test) shuts it down cleanly instead of killing it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	serveErr := make(chan error, 1)
	serving.Store(true)
	go func() { serveErr <- listener.Serve(ln); serving.Store(false) }()
	// credentials.json names this address before the address file says itxd listens: a
	// supervisor that waits for the file and runs `itx --data` reads the address from the
	// credentials, which named the previous run's until then.
	if err := recordAddress(*data, dialable(addr)); err != nil {
		log.Warn().Err(err).Msg("could not record the address in credentials.json: itx --data needs --addr")
	}
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(addr), 0o644); err != nil {
			return err
		}
	}
	announce(log, *logFormat == "json", addr, *data, metricsBound, tlsConfig != nil, min(*maxLoaded, held), held, srv.DiskReserve())

	select {
	case s := <-sig:
		log.Info().Str("signal", s.String()).Msg("shutting down: finishing in-flight calls")
		// A second signal (Ctrl-C again) ends itxd at once, as a kill would: what it
		// acknowledged is on disk. It was dropped, leaving the operator to wait out
		// --shutdown-timeout or to find the pid for a kill -9.
		go func() {
			s := <-sig
			log.Warn().Str("signal", s.String()).Dur("shutdownTimeout", *shutdownTimeout).
				Msg("second signal: exiting now, without waiting for in-flight calls (they are not acknowledged; what was is on disk)")
			os.Exit(1)
		}()
	case err := <-serveErr:
		if err != nil {
			log.Error().Err(err).Msg("rpc listener failed")
		}
	}

	// Stop accepting, let in-flight calls finish (their answers still travel on open
	// connections), close the databases, then the connections.
	serving.Store(false)
	ln.Close()
	sctx, cancel := context.WithTimeout(ctx, *shutdownTimeout)
	defer cancel()
	err = srv.Close(sctx)
	listener.CloseConnections(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("stopped after --shutdown-timeout (%s), before the in-flight calls finished: %w", *shutdownTimeout, err)
		log.Error().Err(err).Msg("stopped")
		return loggedError{err}
	}
	if err != nil {
		return err
	}
	log.Info().Msg("stopped")
	return nil
}

// announce logs the address line and prints how to connect: as text under it, or with
// --log-format json as one more JSON record, so that every line itxd writes parses.
func announce(log zerolog.Logger, jsonLogs bool, addr, data, metrics string, withTLS bool, maxLoadedStreams, maxHeldStreams int, minFreeDisk int64) {
	ev := log.Info().Str("addr", addr).Str("data", data).Bool("tls", withTLS).Int("maxLoadedStreams", maxLoadedStreams).Int("maxHeldStreams", maxHeldStreams).Int64("minFreeDiskBytes", minFreeDisk)
	if metrics != "" {
		ev = ev.Str("metrics", "http://"+metrics+"/metrics")
	}
	ev.Msg("itxd listening")
	creds, err := server.ReadCredentials(data)
	if err != nil {
		log.Warn().Err(err).Msg("no credentials file: log in with the tokens you created")
		return
	}
	tlsFlag := ""
	if withTLS {
		tlsFlag = " --tls --ca <the CA's certificate>"
	}
	if jsonLogs {
		log.Info().Str("connect", fmt.Sprintf("itx --addr %s%s --token %s", dialable(addr), tlsFlag, creds.ProjectToken)).
			Str("deploymentToken", creds.DeploymentToken).Msg("connect with the itx REPL")
		return
	}
	fmt.Fprintf(os.Stderr, "\nConnect with the itx REPL:\n  itx --addr %s%s --token %s\n"+
		"Deployment root (global streams, administration): --token %s\n\n", dialable(addr), tlsFlag, creds.ProjectToken, creds.DeploymentToken)
}

// dialable is the bound address addr as a client on this machine dials it: a wildcard host
// (0.0.0.0, [::]) becomes loopback.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// mintDeploymentToken is itxd --new-deployment-token: it opens the data directory (its lock
// refuses a running itxd's), creates a whole-scope token for the deployment root (audited in
// /audit, by "itxd --new-deployment-token"), records it in credentials.json as the deployment
// token and prints it. Without it, a root whose tokens were all revoked, or whose credentials
// file was lost (a token is kept only as its hash), could never be administered again.
func mintDeploymentToken(log zerolog.Logger, data string) error {
	ctx := context.Background()
	if _, err := os.Stat(filepath.Join(data, "directory.db")); err != nil {
		return fmt.Errorf("--new-deployment-token: %s is not a data directory: %w", data, err)
	}
	srv, err := server.Open(ctx, server.Config{DataDir: data, Log: log, MinFreeDisk: 0})
	if err != nil {
		return err
	}
	label := "new-deployment-token " + time.Now().UTC().Format(time.RFC3339)
	token, info, err := srv.CreateToken(ctx, server.Admin{TokenID: "itxd --new-deployment-token"}, server.DeploymentProjectID, label, 0, itx.Scope{})
	if cerr := srv.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--new-deployment-token: %w", err)
	}
	if err := setCredential(data, "deploymentToken", token, true); err != nil {
		fmt.Fprintf(os.Stderr, "itxd: the token was created but not recorded in credentials.json (%v): keep it from here\n", err)
	}
	fmt.Fprintf(os.Stderr, "created the deployment root's token %s (label %q), recorded in %s:\n", info.ID, label, filepath.Join(data, server.CredentialsFile))
	fmt.Println(token)
	return nil
}

// recordAddress writes the bound RPC address into <data>/credentials.json as "addr", beside the
// tokens, so `itx --data <data>` finds the server wherever `make run` put it. A data directory
// without credentials (tokens made elsewhere) is left alone.
func recordAddress(data, addr string) error { return setCredential(data, "addr", addr, false) }

// setCredential sets one field of <data>/credentials.json. The file keeps its other fields and
// mode 0600; it is replaced by a rename after an fsync (server.WriteFileDurably), so a reader
// never sees half of it and a power cut leaves the old file or the new one. A missing file is
// made when create, else left alone.
func setCredential(data, key, value string, create bool) error {
	path := filepath.Join(data, server.CredentialsFile)
	fields := map[string]json.RawMessage{}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !create:
		return nil
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &fields); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	fields[key], _ = json.Marshal(value)
	out, err := json.MarshalIndent(fields, "", "  ")
	if err != nil {
		return err
	}
	return server.WriteFileDurably(path, append(out, '\n'), 0o600)
}

// heldStreams is --max-held-streams, or when 0 what the process's open-file limit allows: a
// loaded stream holds a SQLite writer and readers (three descriptors each), so 8 per stream,
// after the sockets the other bounds allow (sockets: RPC connections, webhook requests in
// flight and metrics connections) and 1,024 more for everything else. It left only the 1,024:
// with a limit of 20,000, 2,372 held streams and 4,096 RPC connections needed more descriptors
// than the process had.
func heldStreams(flagValue int, sockets int64) int {
	if flagValue > 0 {
		return flagValue
	}
	limit := openFileLimit()
	if limit < 0 {
		return 4096
	}
	return heldStreamsFor(limit, sockets)
}

// openFileLimit is the process's open-file limit (RLIMIT_NOFILE), -1 if it cannot be read.
func openFileLimit() int64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return -1
	}
	return int64(lim.Cur)
}

func heldStreamsFor(limit, sockets int64) int {
	return int(min(max((limit-1024-sockets)/8, 256), 16384))
}

// hostList is a repeatable flag.
type hostList []string

func (h *hostList) String() string     { return strings.Join(*h, ",") }
func (h *hostList) Set(v string) error { *h = append(*h, v); return nil }

// registerFlowMetrics exports the RPC flow-control accounting.
func registerFlowMetrics(r *prometheus.Registry, pool *flowconn.Pool) {
	r.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_calls_in_flight",
			Help: "RPC calls read and not yet answered on the wire, over every connection."},
			func() float64 { return float64(pool.Stats().Calls) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_unwritten_bytes",
			Help: "Encoded RPC messages queued and not yet written to their sockets, over every connection."},
			func() float64 { return float64(pool.Stats().Bytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_call_bytes_in_flight",
			Help: "Encoded bytes of the RPC calls read and not yet answered, over every connection."},
			func() float64 { return float64(pool.Stats().CallBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "itx_rpc_read_pauses_total",
			Help: "Times a connection stopped being read because it, or the server, reached a flow-control bound."},
			func() float64 { return float64(pool.Stats().Pauses) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_unfinished_replies",
			Help: "Replies written whose Finish has not arrived (go-capnp keeps each until then), over every connection."},
			func() float64 { return float64(pool.Stats().Unfinished) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_unfinished_reply_bytes",
			Help: "Encoded bytes of the replies whose Finish has not arrived, over every connection."},
			func() float64 { return float64(pool.Stats().UnfinishedBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_unreturned_calls",
			Help: "Calls itxd made on clients' capabilities that the clients have not returned (go-capnp keeps each until then), over every connection."},
			func() float64 { return float64(pool.Stats().Unreturned) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_capabilities",
			Help: "Capabilities clients hold (go-capnp's export tables, as counted before each read), over every connection."},
			func() float64 { return float64(pool.Stats().Capabilities) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_replies_waiting",
			Help: "Calls whose reply waits for room on its connection (its client is not reading its replies), over every connection."},
			func() float64 { return float64(pool.Stats().ReplyWaits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "itx_rpc_connections_aborted_total",
			Help: "RPC connections aborted for a bound: unfinished replies, capabilities held, calls not returned, no login in time."},
			func() float64 { return float64(pool.Stats().Aborts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "itx_rpc_connections_refused_total",
			Help: "RPC connections refused because --rpc-max-connections were open."},
			func() float64 { return float64(pool.Stats().Refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "itx_rpc_connections_refused_per_address_total",
			Help: "RPC connections refused because their remote address had --rpc-preauth-max-connections-per-address connections not logged in yet."},
			func() float64 { return float64(pool.Stats().RefusedByAddress) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "itx_rpc_preauth_connections",
			Help: "RPC connections not logged in yet."},
			func() float64 { return float64(pool.Stats().PreAuth) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "itx_rpc_preauth_evicted_total",
			Help: "RPC connections not logged in yet closed, oldest first, to make room for a newer one past --rpc-preauth-max-connections."},
			func() float64 { return float64(pool.Stats().PreAuthEvicted) }),
	)
}

// healthz answers 200 while the process serves HTTP at all: a liveness probe.
func healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
}

// readyz answers 200 when the directory database answers and the RPC listener accepts, 503
// otherwise (starting, shutting down, or a directory that fails): a readiness probe. A server
// whose disk is below its reserve stays ready (taken out of a load balancer, nobody could reach
// it to trim or delete the streams that give the space back), and says so in the body.
func readyz(srv *server.Server, serving *atomic.Bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !serving.Load() {
			http.Error(w, "not ready: the RPC listener is not accepting", http.StatusServiceUnavailable)
			return
		}
		if err := srv.Ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := srv.DiskRoom(); err != nil {
			fmt.Fprintf(w, "ready, but appends that add events are refused: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}
