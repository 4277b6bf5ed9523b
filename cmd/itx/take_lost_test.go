package main

import (
	"context"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A script's connection whose itxd vanished (kill -9: no closed notice comes) or that the
// session let go (.reconnect) says it is over: take() answers at once with closed. The first
// waited out its timeout and answered deadlineExceeded, the second answered {events: []} at once
// to every call, without closed, so a loop over take() spun never learning it was gone.
func TestEval_TakeSaysTheConnectionWasLost(t *testing.T) {
	data := t.TempDir()
	itxd, addr := runItxd(t, data, "127.0.0.1:0")
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	ts := &testServer{addr: addr, token: creds.ProjectToken, dir: data}
	ts.appendDirect(t, "/lost", itx.EventInput{Type: "a"})
	s := newSession(t, ts)
	s.mustEval(t, `var c = project.streams.get("/lost").openConnection(0)`)
	require.Len(t, arr(t, obj(t, s.mustEval(t, `c.take(1, 20000)`))["events"]), 1)

	itxd.kill9(t)
	start := time.Now()
	got := obj(t, s.mustEval(t, `c.take(1, 20000)`))
	require.Less(t, time.Since(start), 15*time.Second, "take() waited out its timeout on a connection that was gone")
	require.Empty(t, got["events"])
	closed := obj(t, got["closed"])
	require.Equal(t, "unavailable", closed["code"])
	require.Contains(t, closed["message"], "connectionLost")

	// Let go by a reconnect of the session.
	ts2 := startServer(t)
	ts2.appendDirect(t, "/kept", itx.EventInput{Type: "a"})
	s2 := newSession(t, ts2)
	s2.mustEval(t, `var k = project.streams.get("/kept").openConnection(0)`)
	require.Len(t, arr(t, obj(t, s2.mustEval(t, `k.take(1, 20000)`))["events"]), 1)
	require.NoError(t, s2.RunCommand(context.Background(), "reconnect"))
	start = time.Now()
	got = obj(t, s2.mustEval(t, `k.take(1, 20000)`))
	require.Less(t, time.Since(start), 15*time.Second)
	require.Equal(t, "unavailable", obj(t, got["closed"])["code"], "%v", got)
}
