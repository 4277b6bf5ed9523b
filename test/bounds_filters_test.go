package test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/clocktest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// waitForEvent's payloadContains is bounded: a pattern larger than 16 KiB is refused up front,
// and a match that takes more than its comparisons budget against one event answers
// limitExceeded instead of holding a core (an array pattern against an array payload
// multiplies).
func TestWaitForEvent_PayloadContainsIsBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	s := stream(t, ts.project(t), "/bounds/contains")
	payload := `{"a":[` + strings.Repeat("0,", 3000) + `1]}`
	mustAppend(t, s, ev("big", payload))

	huge := `{"a":[` + strings.Repeat("1,", itx.MaxJSONataLength) + `2]}`
	_, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(huge)}, 0, time.Second)
	requireCode(t, err, itx.ETooLarge)

	pattern := `{"a":[` + strings.Repeat("1,", 3000) + `2]}` // under 16 KiB, ~9,000,000 comparisons
	_, err = client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(pattern)}, 0, 10*time.Second)
	requireCode(t, err, itx.ELimitExceeded)

	e, err := client.WaitForEvent(ctx, s, itx.Predicate{PayloadContains: json.RawMessage(`{"a":[1,0]}`)}, 0, 5*time.Second)
	require.NoError(t, err, "an ordinary pattern still matches")
	require.Equal(t, int64(1), e.Offset)
}

// Type filters are checked and bounded wherever a client gives one: a connection's (kept for
// its life), a read's, a waitForEvent predicate's, a processor host contract's consumed types.
func TestTypeFilters_AreValidatedAndBounded(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	p := ts.project(t)
	s := stream(t, p, "/bounds/types")
	mustAppend(t, s, ev("note", `{}`))
	tooMany := make([]string, itx.MaxTypeFilter+1)
	for i := range tooMany {
		tooMany[i] = "t" + itoa(i)
	}
	for _, types := range [][]string{{"", "note"}, {"has space"}, {"\x01ctl"}, tooMany} {
		_, err := openConn(t, s, connOpts{noState: true, types: types}, newTestSink())
		requireCode(t, err, itx.EInvalid)
		_, err = client.GetEvents(ctx, s, itx.Query{Types: types})
		requireCode(t, err, itx.EInvalid)
		_, err = client.WaitForEvent(ctx, s, itx.Predicate{Types: types}, 0, time.Second)
		requireCode(t, err, itx.EInvalid)
	}
	_, err := openConn(t, s, connOpts{noState: true, types: []string{"note", "*"}}, newTestSink())
	require.NoError(t, err, "valid types and * are fine")

	mount := func(version string, types []string) error {
		h, err := mountHostContract(ctx, p, "host", "proc", version, types)
		if err == nil {
			h.Release()
		}
		return err
	}
	requireCode(t, mount(strings.Repeat("v", 4<<10), []string{"note"}), itx.EInvalid)
	requireCode(t, mount("1", []string{""}), itx.EInvalid)
	requireCode(t, mount("1", tooMany), itx.EInvalid)
	require.NoError(t, mount("1", []string{"note"}))
}

// A project holds at most --max-tokens-per-project tokens: one more is limitExceeded and writes
// nothing; revoking one makes room.
func TestTokens_BoundedPerProject(t *testing.T) {
	ts := startServer(t, server.Config{MaxTokensPerProject: 3})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.project(t))
	defer a.Release()
	list, err := client.ListTokens(ctx, a, "")
	require.NoError(t, err)
	var last itx.TokenInfo
	for i := len(list); i < 3; i++ {
		_, last, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "t" + itoa(i)})
		require.NoError(t, err)
	}
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "one-too-many"})
	requireCode(t, err, itx.ELimitExceeded)
	require.Contains(t, itx.ErrorMessage(err), "--max-tokens-per-project")
	list, err = client.ListTokens(ctx, a, "")
	require.NoError(t, err)
	require.Len(t, list, 3, "nothing written")
	require.NoError(t, client.RevokeToken(ctx, a, "", last.ID))
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "room-again"})
	require.NoError(t, err)
}

// Expired tokens open nothing: at the bound they make room for a new one (the audit stream keeps
// their record), so a project living on short-lived tokens is not locked out.
func TestTokens_ExpiredMakeRoom(t *testing.T) {
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	ts := startServer(t, server.Config{MaxTokensPerProject: 3, Clock: clock})
	ctx := ctxT(t)
	a := client.Admin(ctx, ts.project(t))
	defer a.Release()
	list, err := client.ListTokens(ctx, a, "")
	require.NoError(t, err)
	for i := len(list); i < 3; i++ {
		_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "short" + itoa(i), Expires: clock.Now().Add(time.Minute)})
		require.NoError(t, err)
	}
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "refused"})
	requireCode(t, err, itx.ELimitExceeded)
	clock.Advance(time.Hour)
	_, _, err = client.CreateToken(ctx, a, "", client.TokenOptions{Label: "after-expiry"})
	require.NoError(t, err)
	list, err = client.ListTokens(ctx, a, "")
	require.NoError(t, err)
	require.LessOrEqual(t, len(list), 3)
}
