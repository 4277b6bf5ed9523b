package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/internal/itxtest"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// consumerCells reads the .consumers table the terminal printed after the last match: the
// header's columns, then one map per row until the row count, keyed by column name.
func consumerCells(t *testing.T, term *terminal) []map[string]string {
	t.Helper()
	start := term.mark
	term.expect(" rows)")
	text := regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`).ReplaceAllString(term.dump()[start:term.mark], "")
	gap := regexp.MustCompile(`\s{2,}`)
	var header []string
	var rows []map[string]string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(strings.TrimRight(line, "\r"))
		cells := gap.Split(line, -1)
		switch {
		case header == nil && len(cells) > 5 && cells[0] == "path" && cells[1] == "name":
			header = cells
		case header != nil && len(cells) == len(header):
			row := map[string]string{}
			for i, c := range cells {
				row[header[i]] = c
			}
			rows = append(rows, row)
		}
	}
	require.NotNil(t, header, "no table in %q", text)
	return rows
}

// The .consumers table at the prompt, on a real itxd, shows each consumer as it really stands,
// and the same after itxd restarts: a processor-wake subscription whose contract does not
// exist halted at its first attempt with the registry's error, an itx-call subscription with
// nothing mounted parked (no attempt burnt), a registered reader at its checkpoint; each with
// the head and its lag.
func TestTerminal_ConsumersAcrossARestart(t *testing.T) {
	data := t.TempDir()
	p, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, addr)
	require.NoError(t, err)
	project := conn.Login(ctx, creds.ProjectToken)
	s := client.Stream(ctx, project, "/pty/a")
	_, err = client.Append(ctx, s, []itx.EventInput{{Type: "e", Payload: json.RawMessage(`{}`)}, {Type: "e", Payload: json.RawMessage(`{}`)}}, itx.AppendOptions{})
	require.NoError(t, err)
	subs := client.Subscriptions(ctx, s)
	for _, cfg := range []client.SubscriptionConfig{
		{Name: "nosuch", Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}},
		{Name: "call", Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}},
	} {
		_, _, err := client.ConfigureSubscription(ctx, subs, cfg)
		require.NoError(t, err)
	}
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, s), "dash", 1))
	for name, status := range map[string]string{"nosuch": itx.StatusHalted, "call": itx.StatusParked} {
		require.Eventually(t, func() bool {
			d, err := client.DescribeSubscription(ctx, client.Subscription(ctx, s, name))
			require.NoError(t, err)
			return d.Status == status
		}, 20*time.Second, 10*time.Millisecond, name)
	}
	conn.Close()

	// check reads the table and holds it to what happened, at the head the stream has now.
	check := func(term *terminal) {
		t.Helper()
		term.send(".consumers /pty/\r")
		rows := consumerCells(t, term)
		conn, err := client.Dial(ctx, addr)
		require.NoError(t, err)
		defer conn.Close()
		page, err := client.GetEventPage(ctx, client.Stream(ctx, conn.Login(ctx, creds.ProjectToken), "/pty/a"), itx.Query{})
		require.NoError(t, err)
		head := strconv.FormatInt(page.StreamMaxOffset, 10)
		lagFrom := func(confirmed int64) string { return strconv.FormatInt(page.StreamMaxOffset-confirmed, 10) }
		require.Len(t, rows, 3, "%v", rows)
		byName := map[string]map[string]string{}
		for _, r := range rows {
			byName[r["name"]] = r
			require.Equal(t, "/pty/a", r["path"])
			require.Equal(t, head, r["head"], r["name"])
		}
		require.Equal(t, []string{"nosuch", "call", "dash"}, []string{rows[0]["name"], rows[1]["name"], rows[2]["name"]},
			"halted first, then parked, then by lag")
		halted := byName["nosuch"]
		require.Equal(t, map[string]string{"kind": "processor-wake", "status": "halted", "confirmed": "0", "lag": lagFrom(0), "attempt": "1"},
			map[string]string{"kind": halted["kind"], "status": halted["status"], "confirmed": halted["confirmed"], "lag": halted["lag"], "attempt": halted["attempt"]})
		require.Contains(t, halted["lastError"], `no processor is registered under the name "nosuch"`)
		require.Equal(t, "-", halted["nextAttemptAt"], "a halt schedules no retry")
		parked := byName["call"]
		require.Equal(t, map[string]string{"kind": "itx-call", "status": "parked", "confirmed": "0", "lag": lagFrom(0), "attempt": "0", "nextAttemptAt": "-"},
			map[string]string{"kind": parked["kind"], "status": parked["status"], "confirmed": parked["confirmed"], "lag": parked["lag"], "attempt": parked["attempt"], "nextAttemptAt": parked["nextAttemptAt"]})
		require.Contains(t, parked["lastError"], `capability "inbox" is offline`)
		reader := byName["dash"]
		require.Equal(t, map[string]string{"kind": "reader", "status": "active", "confirmed": "1", "lag": lagFrom(1), "lastError": "-", "attempt": "0"},
			map[string]string{"kind": reader["kind"], "status": reader["status"], "confirmed": reader["confirmed"], "lag": reader["lag"], "lastError": reader["lastError"], "attempt": reader["attempt"]})
	}
	term, _ := bbTerminal(t, &testServer{addr: addr, token: creds.ProjectToken}, 250, 50)
	check(term)

	p.stop(t) // a deploy: every stream is evicted, the rows come back from disk
	term.expect("itx: lost the connection to " + addr)
	_, _ = runItxd(t, data, addr)
	term.expect("itx: reconnected to " + addr)
	check(term)
	term.send("exit\r")
}

// The .consumers table shows where an offset-acking subscription stands between its two marks:
// delivered (what its receiver took) ahead of confirmed (what it made durable), the lag counted
// from confirmed; a confirm closes the gap. Other consumers show delivered at confirmed.
func TestTerminal_ConsumersShowDelivered(t *testing.T) {
	srv := itxtest.Start(t, server.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, srv.Addr)
	require.NoError(t, err)
	defer conn.Close()
	project := conn.Login(ctx, srv.Creds.ProjectToken)
	s := client.Stream(ctx, project, "/acks/a")
	var events []itx.EventInput
	for range 4 {
		events = append(events, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	_, err = client.Append(ctx, s, events, itx.AppendOptions{})
	require.NoError(t, err)
	// The receiver takes every batch and confirms nothing: the subscription confirms later.
	handle, err := client.MountReceiver(ctx, project, "inbox", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
	require.NoError(t, err)
	defer handle.Release()
	subs := client.Subscriptions(ctx, s)
	_, _, err = client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "acking", ConfirmWindow: 100,
		Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "inbox"}})
	require.NoError(t, err)
	require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, s), "dash", 2))
	sub := client.Subscription(ctx, s, "acking")
	var head int64
	require.Eventually(t, func() bool {
		d, err := client.DescribeSubscription(ctx, sub)
		require.NoError(t, err)
		head = d.HeadOffset
		return d.DeliveredOffset == d.HeadOffset
	}, 20*time.Second, 5*time.Millisecond, "the receiver took every event")

	term, _ := bbTerminal(t, &testServer{addr: srv.Addr, token: srv.Creds.ProjectToken}, 250, 50)
	table := func() map[string]map[string]string {
		t.Helper()
		term.send(".consumers /acks/\r")
		byName := map[string]map[string]string{}
		for _, r := range consumerCells(t, term) {
			byName[r["name"]] = r
		}
		return byName
	}
	h := strconv.FormatInt(head, 10)
	rows := table()
	require.Equal(t, map[string]string{"confirmed": "0", "delivered": h, "head": h, "lag": h},
		map[string]string{"confirmed": rows["acking"]["confirmed"], "delivered": rows["acking"]["delivered"], "head": rows["acking"]["head"], "lag": rows["acking"]["lag"]},
		"taken, not confirmed: %v", rows["acking"])
	require.Equal(t, "2", rows["dash"]["delivered"], "a reader's checkpoint is both marks: %v", rows["dash"])

	_, err = client.ConfirmSubscription(ctx, sub, 3)
	require.NoError(t, err)
	rows = table()
	require.Equal(t, map[string]string{"confirmed": "3", "delivered": h, "lag": strconv.FormatInt(head-3, 10)},
		map[string]string{"confirmed": rows["acking"]["confirmed"], "delivered": rows["acking"]["delivered"], "lag": rows["acking"]["lag"]},
		"confirmed through 3: %v", rows["acking"])
	term.send("exit\r")
}

// A stream itxd cannot serve (its file lost while itxd was stopped) stands in the .consumers
// table as one row, unavailable, naming its file, ahead of every other; the other streams'
// consumers are listed. The command failed as a whole with the lost stream's error, so one lost
// file hid where every consumer of the project stood.
func TestTerminal_ConsumersShowAnUnavailableStream(t *testing.T) {
	data := t.TempDir()
	p, addr := runItxdOnLoopback(t, data)
	creds, err := server.ReadCredentials(data)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := client.Dial(ctx, addr)
	require.NoError(t, err)
	project := conn.Login(ctx, creds.ProjectToken)
	ids := map[string]string{}
	for _, path := range []string{"/dmg/lost", "/dmg/kept"} {
		s := client.Stream(ctx, project, path)
		_, err = client.Append(ctx, s, []itx.EventInput{{Type: "e", Payload: json.RawMessage(`{}`)}, {Type: "e", Payload: json.RawMessage(`{}`)}}, itx.AppendOptions{})
		require.NoError(t, err)
		require.NoError(t, client.RegisterReader(ctx, client.Readers(ctx, s), "dash", 1))
		info, err := client.Describe(ctx, s)
		require.NoError(t, err)
		ids[path] = info.StreamID
	}
	conn.Close()
	p.stop(t)
	file := filepath.Join(data, "streams", ids["/dmg/lost"]+".db")
	require.NoError(t, os.Remove(file))
	_, _ = runItxd(t, data, addr)

	term, _ := bbTerminal(t, &testServer{addr: addr, token: creds.ProjectToken}, 250, 50)
	term.send(".consumers /dmg/\r")
	rows := consumerCells(t, term)
	require.Len(t, rows, 2, "%v", rows)
	require.Equal(t, map[string]string{"path": "/dmg/lost", "kind": "stream", "status": "unavailable", "head": "2"},
		map[string]string{"path": rows[0]["path"], "kind": rows[0]["kind"], "status": rows[0]["status"], "head": rows[0]["head"]}, "%v", rows[0])
	require.Contains(t, rows[0]["lastError"], filepath.Base(file))
	require.Equal(t, map[string]string{"path": "/dmg/kept", "name": "dash", "status": "active", "confirmed": "1"},
		map[string]string{"path": rows[1]["path"], "name": rows[1]["name"], "status": rows[1]["status"], "confirmed": rows[1]["confirmed"]})
	term.send("exit\r")
}
