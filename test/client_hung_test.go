package test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/stretchr/testify/require"
)

// returnsWithin runs call and fails the test unless it returns within d.
func returnsWithin(t *testing.T, what string, d time.Duration, call func() error) error {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- call() }()
	select {
	case err := <-got:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still waiting %v after its context ended", what, d)
		return nil
	}
}

// processState is the state letter /proc gives pid ('T' once stopped by a signal).
func processState(t *testing.T, pid int) byte {
	st, err := itxtest.ProcessState(pid)
	require.NoError(t, err)
	return st
}

// itxd stops answering (SIGSTOP: TCP alive, nothing read) while a client calls it, the
// connection's watchdog off so that only the callers' contexts can end the waits: every blocking
// call of the Go client returns once its context ends, code cancelled with the context's error
// for errors.Is. Then the client closes its connection while itxd still answers nothing (Close
// returns), itxd is killed (SIGKILL), and nothing of the client's is left running. MountReceiver waited for the mount's answer without looking at its context, so
// a hung itxd held its caller until the connection ended.
func TestClient_CallsToAHungItxdEndWithTheirContext(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	proc := startItxd(t, t.TempDir(), "--processors", "")
	ctx := ctxT(t)
	opts := clientLeakOptions()

	conn, err := client.DialWith(ctx, proc.addr, client.Options{PingEvery: -1})
	require.NoError(t, err)
	p := conn.Login(ctx, proc.creds.ProjectToken)
	s := client.Stream(ctx, p, "/hung")
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
	require.NoError(t, err)
	subs := client.Subscriptions(ctx, s)
	sub := client.Subscription(ctx, s, "hook")
	readers := client.Readers(ctx, s)
	_, err = client.Describe(ctx, s) // every pipelined capability resolved before itxd stops
	require.NoError(t, err)

	require.NoError(t, proc.cmd.Process.Signal(syscall.SIGSTOP))
	waitUntil(t, "itxd stopped", func() bool { return processState(t, proc.cmd.Process.Pid) == 'T' })
	calls := map[string]func(context.Context) error{
		"Append": func(ctx context.Context) error {
			_, err := client.Append(ctx, s, []itx.EventInput{ev("b", `{}`)}, itx.AppendOptions{})
			return err
		},
		"GetEventPage": func(ctx context.Context) error {
			_, err := client.GetEventPage(ctx, s, itx.Query{})
			return err
		},
		"Describe": func(ctx context.Context) error { _, err := client.Describe(ctx, s); return err },
		"WaitForEvent": func(ctx context.Context) error {
			_, err := client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"never"}}, 0, 20*time.Second)
			return err
		},
		"WaitUntilProcessed": func(ctx context.Context) error {
			_, err := client.WaitUntilProcessed(ctx, sub, 1, 20*time.Second)
			return err
		},
		"ConfigureSubscription": func(ctx context.Context) error {
			_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "hook",
				Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
			return err
		},
		"RegisterReader": func(ctx context.Context) error { return client.RegisterReader(ctx, readers, "r", 1) },
		"OpenConnection": func(ctx context.Context) error {
			_, err := client.OpenConnection(ctx, s, client.ConnectionOptions{}, client.ConnectionHandler{
				Deliver: func(context.Context, itx.DeliveryBatch) error { return nil }})
			return err
		},
		"WatchStream": func(ctx context.Context) error { _, err := client.WatchStream(ctx, s); return err },
		"MountReceiver": func(ctx context.Context) error {
			_, err := client.MountReceiver(ctx, p, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) {
				return 0, nil
			}))
			return err
		},
		"Conn.Ping": conn.Ping,
	}
	for what, call := range calls {
		err := returnsWithin(t, what, 10*time.Second, func() error {
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			return call(cctx)
		})
		require.Error(t, err, what)
		require.Equal(t, itx.ECancelled, itx.ErrorCode(err), "%s: %v", what, err)
		require.True(t, errors.Is(err, context.DeadlineExceeded), "%s: errors.Is(%v, DeadlineExceeded)", what, err)
	}

	// Closed while itxd still answers nothing, then killed.
	for _, c := range []interface{ Release() }{subs, sub, readers, s, p} {
		c.Release()
	}
	returnsWithin(t, "Conn.Close", 10*time.Second, conn.Close)
	<-conn.Done()
	proc.kill9(t)
	verifyNoLeak(t, opts...)
}
