package flowconn_test

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/itx-dev/itx/internal/flowconn"
)

// TestTransport_ReserveReply: a reservation that would pass the connection's reply-bytes bound
// waits until one held is released; one with nothing held always goes; a waiting one gives up
// when its caller's context ends.
func TestTransport_ReserveReply(t *testing.T) {
	pool := flowconn.NewPool(flowconn.Limits{Bytes: 100, GlobalBytes: 1 << 20})
	c, peer := net.Pipe()
	defer peer.Close()
	tr := flowconn.New(c, pool)
	defer tr.Close()
	ctx := context.Background()

	first, err := tr.ReserveReply(ctx, 500, nil) // above the bound, but nothing is held: it goes
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan func(), 1)
	go func() {
		release, err := tr.ReserveReply(ctx, 10, nil)
		if err != nil {
			t.Error(err)
		}
		granted <- release
	}()
	inner, cancel := context.WithCancel(ctx)
	cctx := &checkedCtx{Context: inner, checked: make(chan struct{})}
	gaveUp, waited := make(chan error, 1), 0
	go func() {
		_, err := tr.ReserveReply(cctx, 10, func() { waited++ })
		gaveUp <- err
	}()
	<-cctx.checked                     // it found its context live under the pool's lock: it waits, and the end wakes it
	for pool.Stats().ReplyWaits != 2 { // the other waiter (10 bytes) too
		runtime.Gosched()
	}
	cancel()
	if err := <-gaveUp; err != context.Canceled {
		t.Fatalf("a waiting reservation whose context ended: %v, want context.Canceled", err)
	}
	if waited != 1 {
		t.Fatalf("onWait ran %d times before the wait, want once", waited)
	}
	select {
	case <-granted:
		t.Fatal("a reservation went past the bound while 500 bytes were held")
	default:
	}
	first()
	first() // releasing twice releases once
	(<-granted)()
	if n := pool.Stats().ReplyWaits; n != 0 {
		t.Fatalf("%d reservations still counted as waiting", n)
	}
	// Nothing held again (each release counted): 60 and 40 fit the bound of 100 together.
	for _, n := range []int64{60, 40} {
		if _, err := tr.ReserveReply(ctx, n, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// checkedCtx closes checked the first time its Err is asked.
type checkedCtx struct {
	context.Context
	checked chan struct{}
	once    sync.Once
}

func (c *checkedCtx) Err() error {
	err := c.Context.Err()
	c.once.Do(func() { close(c.checked) })
	return err
}
