package test

import (
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// Each itx error code README lists that a caller can provoke, provoked over RPC against a real
// itxd process: the Go client hands back an error whose itx.ErrorCode is the code and whose
// itx.ErrorMessage is itxd's message, without go-capnp's method prefixes or the "itx.<code>: "
// marker, and the error's text still carries the message.
func TestClient_ErrorCodesCrossTheWire(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes")
	}
	proc := startItxd(t, t.TempDir(), "--processors", "", "--breaker-burst", "3", "--breaker-refill-per-minute", "1",
		"--max-readers-per-stream", "1")
	ctx := ctxT(t)
	conn := dial(t, proc.addr)
	p := conn.Login(ctx, proc.creds.ProjectToken)
	t.Cleanup(p.Release)
	s := stream(t, p, "/codes")
	mustAppend(t, s, keyed("a", `{"n":1}`, "k"))

	check := func(want itx.Code, wantMsg string, err error) {
		t.Helper()
		require.Error(t, err, want)
		require.Equal(t, want, itx.ErrorCode(err), "%v", err)
		msg := itx.ErrorMessage(err)
		require.Contains(t, msg, wantMsg, "%s: %v", want, err)
		require.NotContains(t, msg, "itx."+string(want)+": ", "%s: the message without its code marker: %q", want, msg)
		require.NotContains(t, msg, "capnp:", "%s: the message without go-capnp's prefixes: %q", want, msg)
		require.Contains(t, err.Error(), msg, want)
	}

	_, err := client.Append(ctx, s, []itx.EventInput{{Type: ""}}, itx.AppendOptions{})
	check(itx.EInvalid, "type", err)
	_, err = client.Append(ctx, s, []itx.EventInput{keyed("a", `{"n":2}`, "k")}, itx.AppendOptions{})
	check(itx.EIdempotencyConflict, "k", err)
	_, err = client.Append(ctx, s, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 99})
	check(itx.EOffsetConflict, "99", err)
	big := ev("a", `{"x":"`+strings.Repeat("x", itx.MaxEventBytes)+`"}`)
	_, err = client.Append(ctx, s, []itx.EventInput{big}, itx.AppendOptions{})
	check(itx.ETooLarge, "", err)
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{Types: []string{"never"}}, 0, 50*time.Millisecond)
	check(itx.EDeadlineExceeded, "", err)
	sub := client.Subscription(ctx, s, "nobody")
	t.Cleanup(sub.Release)
	_, err = client.DescribeSubscription(ctx, sub)
	check(itx.ENotFound, `"nobody"`, err)
	ro := client.ReadOnly(ctx, s)
	t.Cleanup(ro.Release)
	_, err = client.Append(ctx, ro, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{})
	check(itx.EPermissionDenied, "", err)
	readers := client.Readers(ctx, s)
	t.Cleanup(readers.Release)
	require.NoError(t, client.RegisterReader(ctx, readers, "one", 0))
	check(itx.ELimitExceeded, "", client.RegisterReader(ctx, readers, "two", 0))

	hot := stream(t, p, "/codes/breaker")
	var rateErr error
	for range 5 {
		if _, rateErr = client.Append(ctx, hot, []itx.EventInput{ev("a", `{}`)}, itx.AppendOptions{}); rateErr != nil {
			break
		}
	}
	check(itx.ERateLimited, "", rateErr)

	stranger := dial(t, proc.addr).Login(ctx, "itx_"+strings.Repeat("0", 48))
	t.Cleanup(stranger.Release)
	_, err = client.DescribeProject(ctx, stranger)
	check(itx.EUnauthenticated, "", err)

}
