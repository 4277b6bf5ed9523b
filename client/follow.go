package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// FollowConfig says which stream Follow reads and how it reconnects.
type FollowConfig struct {
	Addr, Token, Path string
	Dial              Options // TLS, keepalive and pings of each connection to itxd
	// Connection is the first connection's options; After is where Follow starts, and each
	// connection after it opens after the last offset delivered.
	Connection ConnectionOptions
	// MinBackoff and MaxBackoff bound the wait between reconnection attempts (doubling, with
	// jitter). Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// Logf, if set, is told why each connection ended and when the next is tried.
	Logf func(format string, args ...any)
	// Connected, if set, is told each time a connection opens.
	Connected func()
	// Reader, when set, registers a reader of this name on the stream and moves its checkpoint
	// to the last offset delivered (past what a Connection.Types filter passes over: Follow
	// then goes on, and returns, from there too), at most every ReaderInterval (default 1 s)
	// and when Follow stops, so the stream's lag views (subscriptions.list, live state, Streams.list) show where
	// this consumer stands. Its checkpoint is also where to resume from: client.ListReaders. It
	// shares the stream's name space with subscriptions (a subscription's name is refused) and
	// may be the connection's Key.
	Reader         string
	ReaderInterval time.Duration
	// Resume starts after Reader's checkpoint when the reader is registered (otherwise after
	// Connection.After): a follower restarted after its process ended goes on where its last
	// report left it, receiving again what it was delivered after that report (at most
	// ReaderInterval's worth).
	Resume bool
	// StreamID, when set, is the stream Connection.After is an offset of (the StreamID of the
	// batches a previous Follow delivered): a stream at Path with another id (the one followed
	// was deleted, and perhaps created again) ends Follow as streamRemoved does, delivering
	// nothing of it. Left empty, Follow holds to the stream its first batch came from.
	// (Connection.ExpectedStreamID says the same: give either, or both alike.)
	StreamID string
	// PingEvery is how often each connection pings itxd, and PingTimeout how long it waits for
	// the answer before it takes the connection for lost and Follow dials again (defaults 15 s
	// and 10 s; PingEvery < 0: never). Set, they take the place of Dial's (Options.PingEvery).
	// TCP keepalive learns of a peer that vanished, not of one that holds the connection open
	// and answers nothing (a hung or stopped itxd, whose kernel still acknowledges; a stalled
	// proxy between them): without it Follow waited for a batch for as long as ctx lasted.
	PingEvery, PingTimeout time.Duration
}

func (cfg *FollowConfig) defaults() {
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.ReaderInterval <= 0 {
		cfg.ReaderInterval = time.Second
	}
	if cfg.PingEvery != 0 {
		cfg.Dial.PingEvery = cfg.PingEvery
	}
	if cfg.PingTimeout > 0 {
		cfg.Dial.PingTimeout = cfg.PingTimeout
	}
}

// check refuses, before any dial, what no reconnection would mend: an address without a host
// and port (Follow would otherwise retry a dial that cannot succeed for as long as ctx lasts), a
// path that is not a stream path, Resume without a Reader.
func (cfg *FollowConfig) check() error {
	if _, port, err := net.SplitHostPort(cfg.Addr); err != nil || port == "" {
		if err == nil {
			err = errors.New("missing port")
		}
		return itx.Errorf(itx.EInvalid, "FollowConfig.Addr %q is not a host:port address: %v", cfg.Addr, err)
	}
	if err := itx.ValidatePath(cfg.Path); err != nil {
		return itx.Errorf(itx.EInvalid, "FollowConfig.Path: %s", itx.ErrorMessage(err))
	}
	if cfg.Resume && cfg.Reader == "" {
		return itx.Errorf(itx.EInvalid, "FollowConfig.Resume needs a Reader to resume from")
	}
	if a, b := cfg.StreamID, cfg.Connection.ExpectedStreamID; a != "" && b != "" && a != b {
		return itx.Errorf(itx.EInvalid, "FollowConfig.StreamID %q and Connection.ExpectedStreamID %q name two streams", a, b)
	}
	return nil
}

// errPermanent marks an end that a new connection would not change.
type errPermanent struct{ err error }

func (e errPermanent) Error() string { return e.err.Error() }
func (e errPermanent) Unwrap() error { return e.err }

// Follow delivers the events of cfg.Path after cfg.Connection.After to deliver, one batch at a
// time, in offset order, each once, for as long as ctx lasts, across the ends of the connections
// it opens: when itxd goes away (restarted, killed, unreachable, silent: serverShuttingDown,
// connectionLost, a failed dial, a ping unanswered) or deliver was too slow for it
// (slowConsumer), it dials again with backoff and opens a new connection after the last offset
// delivered, so no durable event is missed or repeated. (Ephemeral events appended while no
// connection was open are delivered only with Connection.IncludeEphemeral, and only those
// still buffered.)
//
// It returns the last offset delivered and why it stopped: once ctx ends, code cancelled with
// ctx's error inside (errors.Is finds it); deliver's own error when it failed; or an end a new
// connection would not change (a refused login or open, replaced, streamRemoved, accessEnded: a
// *ConnectionClosed; before any dial, an Addr that is not host:port or a Path that is not a
// stream path: invalidArgument). A stream deleted
// while Follow was away ends it as streamRemoved too, whether or not the path holds another
// stream by then (its offsets start over: going on after the last offset would skip its first
// events). Resume from the offset it returns, with the StreamID of the batches delivered.
func Follow(ctx context.Context, cfg FollowConfig, deliver func(ctx context.Context, batch itx.DeliveryBatch) error) (int64, error) {
	cfg.defaults()
	if err := cfg.check(); err != nil {
		return cfg.Connection.After, err
	}
	var last atomic.Int64
	last.Store(cfg.Connection.After)
	resume := cfg.Resume
	// The stream followed: offsets are positions in one stream's life, so a connection that
	// finds another stream at the path (deleted and created again while Follow was away, its
	// offsets starting over at 1) must not go on "after the last offset delivered" on it.
	streamID := cmp.Or(cfg.StreamID, cfg.Connection.ExpectedStreamID)
	backoff := NewBackoff(cfg.MinBackoff, cfg.MaxBackoff)
	for {
		started := time.Now()
		err := followOnce(ctx, &cfg, &last, &resume, &streamID, deliver)
		if ctx.Err() != nil {
			return last.Load(), cancelled(ctx, "Follow")
		}
		if p, ok := errors.AsType[errPermanent](err); ok {
			return last.Load(), p.err
		}
		wait := backoff.Next(time.Since(started))
		cfg.Logf("follow %s: %v; reconnecting after offset %d in %v", cfg.Path, err, last.Load(), wait.Round(time.Millisecond))
		if err := Sleep(ctx, wait); err != nil {
			return last.Load(), cancelled(ctx, "Follow")
		}
	}
}

// followOnce is one connection's life: it returns why it ended, errPermanent when a new one
// would not change that.
func followOnce(ctx context.Context, cfg *FollowConfig, last *atomic.Int64, resume *bool, streamID *string, deliver func(context.Context, itx.DeliveryBatch) error) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := DialWith(dctx, cfg.Addr, cfg.Dial)
	if err != nil {
		return fmt.Errorf("dial %s: %w", cfg.Addr, err)
	}
	defer conn.Close()
	project := conn.Login(dctx, cfg.Token)
	defer project.Release()
	s := Stream(dctx, project, cfg.Path)
	defer s.Release()
	if *resume {
		readers := Readers(dctx, s)
		list, err := ListReaders(dctx, readers)
		readers.Release()
		if err != nil {
			if code := itx.ErrorCode(err); code == itx.EUnauthenticated || code == itx.EPermissionDenied || code == itx.EInvalid {
				return errPermanent{err}
			}
			return fmt.Errorf("reading reader %q to resume from: %w", cfg.Reader, err)
		}
		for _, r := range list {
			if r.Name == cfg.Reader {
				last.Store(r.Checkpoint)
			}
		}
		*resume = false
	}
	o := cfg.Connection
	o.After = last.Load()
	// The server refuses the open if the path holds another stream (notFound), at the
	// instant it decides the open: no batch of another stream is sent.
	o.ExpectedStreamID = *streamID
	// mu is held while deliver runs: once the connection ended, taking it waits for a batch
	// being delivered, and stopped keeps any later one from deliver (the next connection, or
	// Follow's caller, takes over after the last offset delivered).
	var mu sync.Mutex
	var failed error
	stopped := false
	stop := func() {
		mu.Lock()
		stopped = true
	}
	c, err := OpenConnection(dctx, s, o, ConnectionHandler{Deliver: func(ctx context.Context, b itx.DeliveryBatch) error {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return errors.New("this connection was given up")
		}
		switch {
		case b.StreamID == "" || b.StreamID == *streamID:
		case *streamID == "":
			*streamID = b.StreamID
		default:
			failed = streamReplaced(cfg.Path, *streamID, b.StreamID)
			return failed
		}
		if err := deliver(ctx, b); err != nil {
			failed = err
			return err
		}
		if n := len(b.Events); n > 0 {
			advance(last, b.Events[n-1].Offset)
		}
		return nil
	}})
	if err != nil {
		switch itx.ErrorCode(err) {
		case itx.ENotFound, itx.EInvalid:
			// The stream followed is gone (ExpectedStreamID refused the open; from an itxd
			// older than that option, an offset past the head of the shorter stream at the
			// path now): say which stream the path holds instead.
			if *streamID != "" {
				if info, derr := Describe(dctx, s); derr == nil && info.StreamID != *streamID {
					return errPermanent{streamReplaced(cfg.Path, *streamID, info.StreamID)}
				}
			}
			return errPermanent{err}
		case itx.EUnauthenticated, itx.EPermissionDenied, itx.EFailedPrecondition:
			return errPermanent{err}
		}
		return err
	}
	defer c.Release()
	// The stream the connection opened on, before anything is said of it (the reader's
	// checkpoint below, an offset of the stream followed): a batch tells it too, but none may
	// come for a while.
	if info, err := Describe(dctx, s); err == nil && info.StreamID != "" {
		// (Its own variable: failed may hold deliver's error by now, which is no replacement.)
		var replaced error
		mu.Lock()
		switch {
		case *streamID == "":
			*streamID = info.StreamID
		case info.StreamID != *streamID:
			replaced = streamReplaced(cfg.Path, *streamID, info.StreamID)
			failed = replaced
		}
		mu.Unlock()
		if replaced != nil {
			c.Close(dctx)
			return errPermanent{replaced}
		}
	}
	if cfg.Connected != nil {
		cfg.Connected()
	}
	var checkpoint *checkpointer
	if cfg.Reader != "" {
		readers := Readers(dctx, s)
		defer readers.Release()
		checkpoint = &checkpointer{readers: readers, name: cfg.Reader, last: last, sent: -1, conn: c}
		if err := checkpoint.report(dctx); err != nil {
			c.Close(dctx)
			switch itx.ErrorCode(err) {
			case itx.EPermissionDenied, itx.EInvalid, itx.EFailedPrecondition, itx.ELimitExceeded:
				return errPermanent{fmt.Errorf("registering reader %q: %w", cfg.Reader, err)}
			}
			return fmt.Errorf("registering reader %q: %w", cfg.Reader, err)
		}
		rctx, stopReports := context.WithCancel(ctx)
		reported := make(chan struct{})
		go func() {
			defer close(reported)
			checkpoint.every(rctx, cfg.ReaderInterval, cfg.Logf)
		}()
		defer func() {
			stopReports()
			<-reported
			// Where it stopped, while the connection may still be up (best effort: the next
			// Follow, or the next connection, reports again).
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			checkpoint.report(fctx)
		}()
	}
	cancel()
	// A connection gone silent is closed by its watchdog (cfg.Dial.PingEvery): it ends here as
	// lost, Err saying why. The next connection opens after the last offset delivered; a batch
	// given to deliver meanwhile is waited for.
	select {
	case <-c.Done():
	case <-conn.Done():
	case <-ctx.Done():
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.Close(cctx)
		stop()
		mu.Unlock()
		return ctx.Err()
	}
	stop()
	defer mu.Unlock()
	if failed != nil {
		return errPermanent{failed}
	}
	var cc *ConnectionClosed
	if !errors.As(c.Err(), &cc) || cc.Why == schema.CloseReason_connectionLost { // the RPC connection ended
		if err := conn.Err(); err != nil { // itxd's abort, or a ping unanswered
			return fmt.Errorf("the connection to itxd ended: %w", err)
		}
		if cc == nil {
			return &ConnectionClosed{Why: schema.CloseReason_connectionLost}
		}
	}
	switch cc.Why {
	case schema.CloseReason_connectionLost, schema.CloseReason_serverShuttingDown, schema.CloseReason_slowConsumer:
		return cc
	}
	return errPermanent{cc}
}

// UntilSilent calls ping every interval and returns, code disconnected, once a ping goes
// unanswered for timeout: an itxd that holds the connection open and answers nothing, which TCP
// keepalive does not notice (every Conn watches itself so, Options.PingEvery). It returns nil
// when ctx ends, and leaves an ended connection to whoever watches it end (a ping on it fails
// at once, not for want of an answer).
func UntilSilent(ctx context.Context, ping func(context.Context) error, every, timeout time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := ping(pctx)
		unanswered := err != nil && pctx.Err() != nil && ctx.Err() == nil
		cancel()
		if unanswered {
			return itx.Errorf(itx.EDisconnected, "itxd answered no ping for %v: the connection is taken for lost", timeout)
		}
	}
}

// streamReplaced is how Follow ends when the stream at path is no longer the one it followed
// (was): deleted, and now another (now, "" for none).
func streamReplaced(path, was, now string) *ConnectionClosed {
	msg := fmt.Sprintf("the stream %s followed (id %s) was deleted", path, was)
	if now != "" {
		msg += fmt.Sprintf(" and %s is another stream now (id %s, its offsets starting over)", path, now)
	}
	return &ConnectionClosed{Why: schema.CloseReason_streamRemoved, Reason: &itx.Error{Code: itx.ENotFound, Message: msg}}
}

// advance moves last to at, never back.
func advance(last *atomic.Int64, at int64) {
	for {
		was := last.Load()
		if at <= was || last.CompareAndSwap(was, at) {
			return
		}
	}
}

// checkpointer moves a registered reader's checkpoint to the last offset delivered.
type checkpointer struct {
	readers schema.Readers
	name    string
	last    *atomic.Int64
	sent    int64 // the checkpoint last registered (-1: none yet)
	// conn, while open, says how far it delivered: past the last event handed to deliver when
	// its Types filter (or an ephemeral event from before the open) passed over what follows.
	// Without it a reader following a rare type stayed at its last match: its lag grew with
	// every other append, and its checkpoint held back the stream's trims and retention.
	conn *Connection
}

// report registers the checkpoint if it moved since the last report.
func (k *checkpointer) report(ctx context.Context) error {
	if k.conn != nil {
		// The server counts a batch delivered once deliver accepted it, and a stretch its
		// filter passed over once every batch before it was accepted: everything at or below
		// it reached deliver or was never to. (A closed connection answers an error: last
		// stands.)
		if _, delivered, err := k.conn.Ping(ctx); err == nil {
			advance(k.last, delivered)
		}
	}
	at := k.last.Load()
	if at == k.sent {
		return nil
	}
	if err := RegisterReader(ctx, k.readers, k.name, at); err != nil {
		return err
	}
	k.sent = at
	return nil
}

// every reports every interval until ctx ends.
func (k *checkpointer) every(ctx context.Context, interval time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := k.report(ctx); err != nil && ctx.Err() == nil {
				logf("follow: moving reader %q to %d: %v", k.name, k.last.Load(), err)
			}
		}
	}
}
