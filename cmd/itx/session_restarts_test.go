package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx/cmd/itx/internal/repl"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// An itx session across several itxd restarts in a row (SIGKILL, SIGTERM, SIGKILL): each call
// made after one waits for the reconnect and runs once, the variables are kept, a connection
// opened at the prompt says it ended with the lost connection, and once the session is closed
// nothing of it is left running (a connection, a watchdog or a capability of an earlier itxd).
func TestSession_RepeatedRestartsKeepVariablesAndLeaveNothing(t *testing.T) {
	data := t.TempDir()
	itxd, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/itx-dev/itx/cmd/itx.tryRunItxd.func1")}

	errs := newSyncBuffer()
	s, err := repl.Connect(ctx, repl.Config{Addr: addr, Token: creds.ProjectToken, Out: newSyncBuffer(), Err: errs, Format: repl.FormatJSON})
	require.NoError(t, err)
	eval := func(src string) string {
		t.Helper()
		v, err := s.Eval(ctx, "<test>", src)
		require.NoError(t, err, src)
		if v == nil {
			return ""
		}
		return v.String()
	}
	eval(`var s = project.streams.get("/restarts")`)
	eval(`s.append({type: "x", idempotencyKey: "k0"})`)
	for round, how := range []string{"SIGKILL", "SIGTERM", "SIGKILL"} {
		eval(`var c = s.openConnection({})`)
		require.Equal(t, "true", eval(`String(c.take(1, 10000).events.length >= 1)`), "round %d", round)
		if how == "SIGTERM" {
			itxd.stop(t)
		} else {
			itxd.kill9(t)
		}
		itxd, _ = runItxd(t, data, addr)
		// Made after the loss: it waits for the reconnect, and the variable still names /restarts.
		eval(`s.append({type: "x", idempotencyKey: "k` + string(rune('1'+round)) + `"})`)
		// Told why: SIGTERM closes it serverShuttingDown, a SIGKILL loses it.
		want := map[string]string{"SIGKILL": "connectionLost: ", "SIGTERM": "serverShuttingDown"}[how]
		closed := eval(`c.take().closed.message`)
		require.True(t, strings.HasPrefix(closed, want), "round %d: %s", round, closed)
		eval(`c.close()`)
	}
	require.Equal(t, "4", eval(`String(s.describe().headOffset)`), "each append ran once")
	require.Equal(t, 3, strings.Count(errs.String(), "itx: reconnected to "+addr), "reconnected once a restart: %q", errs.String())
	require.NoError(t, s.Close())
	// The session's goroutines may take longer to end on a loaded machine than VerifyNone's
	// half a second of looking: look (Find waits between its looks) for as long as waitUntil
	// would, then report what is left.
	for deadline := time.Now().Add(20 * time.Second); goleak.Find(opts...) != nil && time.Now().Before(deadline); {
	}
	goleak.VerifyNone(t, opts...)
}
