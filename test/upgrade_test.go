package test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// upgradeExpected is testdata/upgrade/populate's expected.json: what the old itxd acknowledged.
type upgradeExpected struct {
	Commit        string                    `json:"commit"`
	Events        map[string][]upgradeEvent `json:"events"`
	Heads         map[string]int64          `json:"heads"`
	Subscriptions map[string]upgradeSub     `json:"subscriptions"`
	Readers       map[string]int64          `json:"readers"`
	Scheduled     map[string]int64          `json:"scheduled"`
	HookSecret    string                    `json:"hookSecret"`
	Tokens        map[string]string         `json:"tokens"`
	OtherProject  string                    `json:"otherProject"`
	RevokedToken  string                    `json:"revokedToken,omitempty"`
	Trimmed       int64                     `json:"trimmed,omitempty"`
	TrimReaders   map[string]int64          `json:"trimReaders,omitempty"`
}

type upgradeEvent struct {
	Offset    int64           `json:"offset"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	Key       string          `json:"key,omitempty"`
	Ephemeral bool            `json:"ephemeral,omitempty"`
}

type upgradeSub struct {
	Kind      string `json:"kind"`
	Status    string `json:"status"`
	Confirmed int64  `json:"confirmed"`
}

// upgradeHookAddr is where the fixtures' webhook subscription posts (populate's HookAddr).
const upgradeHookAddr = "127.0.0.1:47613"

// extractFixture unpacks testdata/upgrade/<name>.tar.gz into a fresh private directory.
func extractFixture(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.Mkdir(dir, 0o700))
	f, err := os.Open(filepath.Join("testdata", "upgrade", name+".tar.gz"))
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		target := filepath.Join(dir, filepath.Clean(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(target, 0o700))
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(target, b, 0o600))
		}
	}
	return dir
}

// hookRecorder is the fixtures' webhook receiver: it verifies each delivery's signature and
// records the offsets, acknowledging every one.
type hookRecorder struct {
	secret  string
	mu      sync.Mutex
	offsets []int64
	bad     []string
	got     chan struct{}
}

func (h *hookRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/hook" {
		w.WriteHeader(204) // the dead-letter subscription's receiver: nothing more should reach it
		return
	}
	var e struct{ Event struct{ Offset int64 } }
	json.Unmarshal(body, &e)
	h.mu.Lock()
	if err := client.VerifyWebhook(h.secret, r.Header, body, time.Now()); err != nil {
		h.bad = append(h.bad, err.Error())
	}
	h.offsets = append(h.offsets, e.Event.Offset)
	h.mu.Unlock()
	select {
	case h.got <- struct{}{}:
	default:
	}
	w.WriteHeader(204)
}

// TestUpgrade_OldDataDirectories opens data directories written by older itxd builds
// (testdata/upgrade, see its README) with this build's itxd and checks that the upgrade kept
// everything: acknowledged events with their offsets and bodies, idempotency keys, subscription
// cursors and statuses (no redelivery, no skipped event), webhook secrets, readers' checkpoints,
// scheduled appends (fired once, or kept), projects and tokens, and the stream listing.
func TestUpgrade_OldDataDirectories(t *testing.T) {
	fixtures, err := filepath.Glob(filepath.Join("testdata", "upgrade", "*.tar.gz"))
	require.NoError(t, err)
	require.NotEmpty(t, fixtures)
	for _, f := range fixtures {
		name := strings.TrimSuffix(filepath.Base(f), ".tar.gz")
		t.Run(name, func(t *testing.T) { checkUpgrade(t, name) })
	}
}

func checkUpgrade(t *testing.T, name string) {
	ctx := ctxT(t)
	dir := extractFixture(t, name)
	b, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	require.NoError(t, err)
	var exp upgradeExpected
	require.NoError(t, json.Unmarshal(b, &exp))

	hook := &hookRecorder{secret: exp.HookSecret, got: make(chan struct{}, 1)}
	ln, err := net.Listen("tcp", upgradeHookAddr)
	if err != nil {
		t.Skipf("the fixtures' webhook address %s is taken: %v", upgradeHookAddr, err)
	}
	hs := &http.Server{Handler: hook}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	p := startItxd(t, dir)
	conn := dial(t, p.addr)
	project := conn.Login(ctx, exp.Tokens["project"])
	t.Cleanup(project.Release)
	// Before anything here loads /a: the listing of a stream not loaded comes from the
	// directory's summary, which must say where its consumers stand.
	t.Run("Streams.list says where consumers stand before the stream loads", func(t *testing.T) {
		infos, err := client.ListStreams(ctx, project, "/a")
		require.NoError(t, err)
		require.Len(t, infos, 1)
		halted, parked := 0, 0
		for _, s := range exp.Subscriptions {
			switch s.Status {
			case itx.StatusHalted:
				halted++
			case itx.StatusParked:
				parked++
			}
		}
		require.Equal(t, halted, infos[0].HaltedSubscriptions, "halted subscriptions (loaded: %v)", infos[0].Loaded)
		// Migration 013 counts parked subscriptions, refreshed at the first start as readers are.
		require.Equal(t, parked, infos[0].ParkedSubscriptions, "parked subscriptions (loaded: %v)", infos[0].Loaded)
		// nosuch halted at 0, so the slowest consumer lags by the whole head.
		require.Equal(t, infos[0].HeadOffset, infos[0].MaxLag, "max lag (loaded: %v)", infos[0].Loaded)
		// Migration 012 counts readers: every stream's summary is refreshed at the first start.
		require.Equal(t, len(exp.Readers), infos[0].Readers, "readers (loaded: %v)", infos[0].Loaded)

		// Every stream the old build wrote is listed, none loaded yet (directory migration 014
		// must find each born).
		all, err := client.ListStreams(ctx, project, "")
		require.NoError(t, err)
		heads := map[string]int64{}
		for _, i := range all {
			heads[i.Path] = i.HeadOffset
		}
		for path, h := range exp.Heads {
			require.Contains(t, heads, path, "every stream of the old build is listed")
			require.GreaterOrEqual(t, heads[path], h, path)
		}
	})

	a := stream(t, project, "/a")

	t.Run("events kept with their offsets and bodies", func(t *testing.T) {
		for path, want := range exp.Events {
			got, err := client.ReadAll(ctx, stream(t, project, path), itx.Query{IncludeEphemeral: true})
			require.NoError(t, err, path)
			require.GreaterOrEqual(t, len(got), len(want), path)
			for i, w := range want {
				g := got[i]
				require.Equal(t, w.Offset, g.Offset, "%s event %d", path, i)
				require.Equal(t, w.Type, g.Type, "%s offset %d", path, w.Offset)
				require.JSONEq(t, string(w.Payload), string(g.Payload), "%s offset %d", path, w.Offset)
				if len(w.Metadata) > 0 {
					require.JSONEq(t, string(w.Metadata), string(g.Metadata), "%s offset %d", path, w.Offset)
				}
				require.Equal(t, w.Key, g.IdempotencyKey, "%s offset %d", path, w.Offset)
				require.Equal(t, w.Ephemeral, g.Ephemeral, "%s offset %d", path, w.Offset)
			}
		}
	})

	t.Run("every append acknowledged before a kill -9 is there", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(dir, "acked.jsonl"))
		if errors.Is(err, os.ErrNotExist) {
			t.Skip("stopped with SIGTERM, no traffic")
		}
		require.NoError(t, err)
		got, err := client.ReadAll(ctx, a, itx.Query{Types: []string{"load"}})
		require.NoError(t, err)
		byOffset := map[int64]string{}
		for _, e := range got {
			byOffset[e.Offset] = e.IdempotencyKey
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		require.NotEmpty(t, lines)
		for _, l := range lines {
			var ack struct {
				Offset int64
				Key    string
			}
			require.NoError(t, json.Unmarshal([]byte(l), &ack), l)
			require.Equal(t, ack.Key, byOffset[ack.Offset], "acknowledged %s at %d", ack.Key, ack.Offset)
		}
	})

	t.Run("tokens still log in", func(t *testing.T) {
		for label, tok := range exp.Tokens {
			pr := conn.Login(ctx, tok)
			_, err := client.DescribeProject(ctx, pr)
			pr.Release()
			require.NoError(t, err, "token %s", label)
		}
		if tok := exp.RevokedToken; tok != "" {
			pr := conn.Login(ctx, tok)
			_, err := client.DescribeProject(ctx, pr)
			pr.Release()
			requireCode(t, err, itx.EUnauthenticated)
		}
		if tok := exp.Tokens["scoped"]; tok != "" {
			pr := conn.Login(ctx, tok)
			defer pr.Release()
			x := client.Stream(ctx, pr, "/x/1")
			defer x.Release()
			_, err := client.GetEvents(ctx, x, itx.Query{})
			require.NoError(t, err, "the scoped token reads under its prefix")
			_, err = client.Append(ctx, x, []itx.EventInput{ev("o", `{}`)}, itx.AppendOptions{})
			requireCode(t, err, itx.EPermissionDenied)
		}
	})

	t.Run("subscriptions keep their cursors and statuses", func(t *testing.T) {
		list, err := client.ListSubscriptions(ctx, client.Subscriptions(ctx, a))
		require.NoError(t, err)
		got := map[string]itx.SubscriptionSummary{}
		for _, s := range list {
			got[s.Name] = s
		}
		for name, w := range exp.Subscriptions {
			g, ok := got[name]
			require.True(t, ok, "subscription %s kept", name)
			require.Equal(t, w.Kind, g.Kind, name)
			if name == "hook" || name == "mirror" || name == "dl" || ((name == "guestbook" || name == "forwarder") && w.Status != itx.StatusHalted) {
				require.GreaterOrEqual(t, g.ConfirmedOffset, w.Confirmed, "%s never goes back", name)
				continue
			}
			require.Equal(t, w.Status, g.Status, name)
			require.Equal(t, w.Confirmed, g.ConfirmedOffset, name)
		}
	})

	t.Run("every subscription describes itself, the webhook's secret set and not shown", func(t *testing.T) {
		for name, w := range exp.Subscriptions {
			if w.Kind == "reader" {
				continue
			}
			sub := client.Subscription(ctx, a, name)
			d, err := client.DescribeSubscription(ctx, sub)
			sub.Release()
			require.NoError(t, err, name)
			require.Equal(t, w.Kind, d.Kind, name)
			require.Equal(t, name == "hook", d.SecretSet, "%s: secret set", name)
			b, err := json.Marshal(d.Config)
			require.NoError(t, err)
			require.NotContains(t, string(b), strings.TrimPrefix(exp.HookSecret, "whsec_"), "%s: the secret itself is never shown", name)
		}
	})

	t.Run("readers keep their checkpoints", func(t *testing.T) {
		fut, release := a.Readers(ctx, nil)
		defer release()
		readers, err := client.ListReaders(ctx, fut.Readers())
		require.NoError(t, err)
		got := map[string]int64{}
		for _, r := range readers {
			got[r.Name] = r.Checkpoint
		}
		require.Equal(t, exp.Readers, got)
	})

	// A reader registered before stream migration 006 has no owner: the first token that
	// registers it again takes it, and another token (without the admin right) is then
	// refused. One registered since (the fixtures with a trimmed stream) is its registrant's,
	// the project's token: another token is refused from the start.
	t.Run("readers registered before keep or gain their owners", func(t *testing.T) {
		sc := itx.Scope{Prefix: "/", Rights: []itx.Right{itx.RightRead, itx.RightSubscribe}}
		login := func(label string) schema.Project {
			tok, _, err := client.CreateToken(ctx, client.Admin(ctx, project), "", client.TokenOptions{Label: label, Scope: sc})
			require.NoError(t, err)
			p := conn.Login(ctx, tok)
			t.Cleanup(p.Release)
			return p
		}
		u1, u2 := login("upgrade-u1"), login("upgrade-u2")
		move := func(p schema.Project) error {
			return client.RegisterReader(ctx, client.Readers(ctx, client.Stream(ctx, p, "/a")), "r1", exp.Readers["r1"])
		}
		if exp.Trimmed == 0 {
			require.NoError(t, move(u1), "an owner-less reader is taken by the first token that registers it")
		}
		requireCode(t, move(u2), itx.EPermissionDenied)
		if exp.Trimmed > 0 {
			require.NoError(t, move(project), "its registrant still moves it")
		}
	})

	if exp.Trimmed > 0 {
		// A stream trimmed by the old build keeps its gap (stream migration 005), the keys of
		// the events it kept, its readers' checkpoints and which of them hold back trims: the
		// one the project's token registered does (006 kept it as its owner's), the one
		// registered through a read-only attenuation does not (007).
		t.Run("a trimmed stream keeps its gap, its keys and its readers' holds", func(t *testing.T) {
			tr := stream(t, project, "/trimmed")
			info, err := client.Describe(ctx, tr)
			require.NoError(t, err)
			require.Equal(t, exp.Trimmed, info.TrimmedThrough)
			require.Equal(t, exp.Heads["/trimmed"], info.HeadOffset)
			readers, err := client.ListReaders(ctx, client.Readers(ctx, tr))
			require.NoError(t, err)
			got := map[string]int64{}
			for _, r := range readers {
				got[r.Name] = r.Checkpoint
			}
			require.Equal(t, exp.TrimReaders, got)
			for _, e := range exp.Events["/trimmed"] {
				res, err := client.Append(ctx, tr, []itx.EventInput{{Type: e.Type, Payload: e.Payload, IdempotencyKey: e.Key}}, itx.AppendOptions{})
				require.NoError(t, err, e.Key)
				require.Equal(t, []int64{e.Offset}, res.Offsets, "key %s", e.Key)
			}
			r, err := client.Trim(ctx, tr, exp.Heads["/trimmed"])
			require.NoError(t, err)
			require.Equal(t, exp.TrimReaders["holds"], r.TrimmedThrough, "only the reader with the subscribe right holds the trim")
		})
	}

	t.Run("idempotency keys written before still dedupe", func(t *testing.T) {
		for _, e := range exp.Events["/a"] {
			if e.Key == "" || strings.HasPrefix(e.Key, itx.InternalKeyPrefix) {
				continue // the server's own keys are reserved to it
			}
			res, err := client.Append(ctx, a, []itx.EventInput{{Type: e.Type, Payload: e.Payload, Metadata: e.Metadata, IdempotencyKey: e.Key}}, itx.AppendOptions{})
			require.NoError(t, err, e.Key)
			require.Equal(t, []int64{e.Offset}, res.Offsets, "key %s", e.Key)
			_, err = client.Append(ctx, a, []itx.EventInput{keyed(e.Type, `{"other":true}`, e.Key)}, itx.AppendOptions{})
			requireCode(t, err, itx.EIdempotencyConflict)
		}
	})

	if due, ok := exp.Scheduled["soon"]; ok {
		t.Run("scheduled appends fire once or stay scheduled", func(t *testing.T) {
			e, err := client.WaitForEvent(ctx, a, itx.Predicate{Types: []string{"timer"}}, exp.Heads["/a"], 20*time.Second)
			require.NoError(t, err, "the due append (due %d) fires", due)
			require.Equal(t, "soon", e.IdempotencyKey)
			require.Equal(t, 1, countType(t, a, "timer"), "the due append fired once")
			list, err := client.ListScheduled(ctx, a)
			require.NoError(t, err)
			require.Len(t, list, 1)
			require.Equal(t, "later", list[0].Event.IdempotencyKey)
			require.Equal(t, exp.Scheduled["later"], list[0].DueAt)
		})
	}

	var head int64
	t.Run("appends continue at the next offset", func(t *testing.T) {
		info, err := client.Describe(ctx, a)
		require.NoError(t, err)
		require.GreaterOrEqual(t, info.HeadOffset, exp.Heads["/a"])
		res := mustAppend(t, a, ev("note", `{"after":"upgrade"}`))
		require.Equal(t, []int64{info.HeadOffset + 1}, res.Offsets)
		head = res.Offsets[0]
	})

	t.Run("the webhook resumes after its cursor, signed with the kept secret", func(t *testing.T) {
		sub := client.Subscription(ctx, a, "hook")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
		require.NoError(t, err)
		hook.mu.Lock()
		defer hook.mu.Unlock()
		require.Empty(t, hook.bad, "signatures")
		require.NotEmpty(t, hook.offsets)
		durable := durableAfter(t, ctx, a, exp.Subscriptions["hook"].Confirmed, head)
		require.Equal(t, durable, dedupe(hook.offsets), "delivered exactly the durable events after the cursor")
	})

	// A parked itx-call resumes after its cursor when its receiver is mounted again; an
	// offset-acking one ("acking", confirmed through 9 and delivered further) delivers again
	// what it had delivered and not confirmed, and nothing at or below the cursor.
	for sub, capability := range map[string]string{"call": "rx", "acking": "acker"} {
		if _, ok := exp.Subscriptions[sub]; !ok {
			continue
		}
		t.Run("parked "+sub+" resumes after its cursor on mount", func(t *testing.T) {
			var mu sync.Mutex
			var got []int64
			rx := client.ServeReceiver(func(ctx context.Context, batch itx.DeliveryBatch) (int64, error) {
				mu.Lock()
				defer mu.Unlock()
				for _, e := range batch.Events {
					got = append(got, e.Offset)
				}
				return batch.Events[len(batch.Events)-1].Offset, nil
			})
			h, err := client.MountReceiver(ctx, project, capability, rx)
			require.NoError(t, err)
			defer h.Release()
			s := client.Subscription(ctx, a, sub)
			defer s.Release()
			_, err = client.WaitUntilProcessed(ctx, s, head, 20*time.Second)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, durableAfter(t, ctx, a, exp.Subscriptions[sub].Confirmed, head), dedupe(got))
		})
	}

	if want, ok := exp.Events["/dead"]; ok {
		t.Run("the dead letter is kept and not written again", func(t *testing.T) {
			s := client.Subscription(ctx, a, "dl")
			defer s.Release()
			_, err := client.WaitUntilProcessed(ctx, s, head, 20*time.Second)
			require.NoError(t, err)
			got, err := client.ReadAll(ctx, stream(t, project, "/dead"), itx.Query{})
			require.NoError(t, err)
			require.Len(t, got, len(want))
		})
	}

	t.Run("the mirror and the processor catch up without repeats", func(t *testing.T) {
		names := []string{"mirror", "guestbook", "forwarder"}
		processorRan := exp.Subscriptions["guestbook"].Status != itx.StatusHalted // an old build without it halted it
		if !processorRan {
			names = names[:1]
		}
		for _, name := range names {
			sub := client.Subscription(ctx, a, name)
			_, err := client.WaitUntilProcessed(ctx, sub, head, 20*time.Second)
			sub.Release()
			require.NoError(t, err, name)
		}
		mirror, err := client.ReadAll(ctx, stream(t, project, "/mirror"), itx.Query{})
		require.NoError(t, err)
		all, err := client.ReadAll(ctx, a, itx.Query{Before: head + 1})
		require.NoError(t, err)
		var src, copied []int64
		for _, e := range all {
			if e.Type != itx.TypeWoken { // lifecycle noise does not travel
				src = append(src, e.Offset)
			}
		}
		for _, e := range mirror {
			copied = append(copied, e.Provenance[len(e.Provenance)-1].Offset)
		}
		require.Equal(t, src, copied, "one copy of every durable event of /a, in order")
		if !processorRan {
			return
		}
		_, proc := processorOf(t, a, "guestbook")
		snap, err := client.Snapshot(ctx, proc)
		require.NoError(t, err)
		var st struct{ Count int }
		require.NoError(t, json.Unmarshal([]byte(snap.State), &st), snap.State)
		require.Equal(t, countType(t, a, "guestbook/signed"), st.Count, snap.State)

		// The forwarder's side effect (an append per inbox message) ran once per message
		// across the upgrade: none again, none lost.
		if _, ok := exp.Subscriptions["forwarder"]; !ok {
			return
		}
		inbox, err := client.ReadAll(ctx, a, itx.Query{Types: []string{"inbox/message"}})
		require.NoError(t, err)
		outbox, err := client.ReadAll(ctx, a, itx.Query{Types: []string{"outbox/forwarded"}})
		require.NoError(t, err)
		var want, got []int64
		for _, e := range inbox {
			want = append(want, e.Offset)
		}
		for _, e := range outbox {
			var f struct{ SourceOffset int64 }
			require.NoError(t, json.Unmarshal(e.Payload, &f), string(e.Payload))
			got = append(got, f.SourceOffset)
		}
		require.Equal(t, want, got, "one forward per inbox message")
	})

	t.Run("the halted subscription stays halted", func(t *testing.T) {
		list, err := client.ListSubscriptions(ctx, client.Subscriptions(ctx, a))
		require.NoError(t, err)
		for _, s := range list {
			if s.Name == "nosuch" {
				require.Equal(t, itx.StatusHalted, s.Status)
				return
			}
		}
		t.Fatal("nosuch is gone")
	})

	t.Run("Streams.list shows every stream's true head", func(t *testing.T) {
		infos, err := client.ListStreams(ctx, project, "")
		require.NoError(t, err)
		heads := map[string]int64{}
		for _, i := range infos {
			heads[i.Path] = i.HeadOffset
		}
		require.Equal(t, head, heads["/a"])
		mirrorInfo, err := client.Describe(ctx, stream(t, project, "/mirror"))
		require.NoError(t, err)
		require.Equal(t, mirrorInfo.HeadOffset, heads["/mirror"])
	})

	// A second start of this build on the upgraded directory (after SIGTERM) delivers nothing
	// again: the webhook gets only what is appended now, signed with the secret still kept,
	// and no timer, dead letter or forward is written twice.
	t.Run("a second start delivers only what is new", func(t *testing.T) {
		counts := map[string]int{}
		for _, typ := range []string{"timer", "outbox/forwarded", "load"} {
			counts[typ] = countType(t, a, typ)
		}
		require.NoError(t, p.stop(t))
		hook.mu.Lock()
		delivered := head // the first start's webhook deliveries reached at least head
		for _, o := range hook.offsets {
			delivered = max(delivered, o)
		}
		hook.offsets = nil
		hook.mu.Unlock()

		p2 := startItxd(t, dir)
		project2 := dial(t, p2.addr).Login(ctx, exp.Tokens["project"])
		t.Cleanup(project2.Release)
		a2 := stream(t, project2, "/a")
		res := mustAppend(t, a2, ev("note", `{"after":"second start"}`))
		sub := client.Subscription(ctx, a2, "hook")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, res.Offsets[0], 20*time.Second)
		require.NoError(t, err)
		hook.mu.Lock()
		require.Empty(t, hook.bad, "signatures")
		require.Equal(t, durableAfter(t, ctx, a2, delivered, res.Offsets[0]), dedupe(hook.offsets), "only what came after the first start's last delivery")
		hook.mu.Unlock()
		for typ, n := range counts {
			require.Equal(t, n, countType(t, a2, typ), typ)
		}
		if want, ok := exp.Events["/dead"]; ok {
			got, err := client.ReadAll(ctx, stream(t, project2, "/dead"), itx.Query{})
			require.NoError(t, err)
			require.Len(t, got, len(want))
		}
	})
}

// durableAfter lists the offsets of s's durable events in (after, through].
func durableAfter(t *testing.T, ctx context.Context, s schema.Stream, after, through int64) []int64 {
	t.Helper()
	events, err := client.ReadAll(ctx, s, itx.Query{After: after, Before: through + 1})
	require.NoError(t, err)
	var out []int64
	for _, e := range events {
		out = append(out, e.Offset)
	}
	return out
}

// dedupe sorts offsets and drops repeats (at-least-once: a receiver dedupes by offset).
func dedupe(offsets []int64) []int64 {
	s := append([]int64(nil), offsets...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var out []int64
	for i, o := range s {
		if i == 0 || o != s[i-1] {
			out = append(out, o)
		}
	}
	return out
}

// A start that migrates the data directory logs from which schema version to which: an upgrade
// is visible in the operator's log.
func TestUpgrade_LogsTheDirectoryMigration(t *testing.T) {
	fixtures, err := filepath.Glob(filepath.Join("testdata", "upgrade", "*.tar.gz"))
	require.NoError(t, err)
	require.NotEmpty(t, fixtures)
	dir := extractFixture(t, strings.TrimSuffix(filepath.Base(fixtures[0]), ".tar.gz"))
	var logs syncBuffer
	startServer(t, server.Config{DataDir: dir, Log: zerolog.New(&logs)})
	require.Contains(t, logs.String(), "upgraded the data directory's schema")
	require.Regexp(t, `"from":\d+,"to":\d+`, logs.String())

	var again syncBuffer
	startServer(t, server.Config{DataDir: t.TempDir(), Log: zerolog.New(&again)})
	require.NotContains(t, again.String(), "upgraded the data directory's schema", "a new directory is not an upgrade")
}

// Opening a stream written by an older build logs its schema migration (streams migrate one by
// one as each first opens, which the directory's line at start does not cover), naming the
// project, the path and the versions, once: not at its next load. A trim of a stream whose file
// predates auto_vacuum warns, once per stream, that its space stays in the file, naming the file
// and the conversion (an operator trimming to free a filling disk saw nothing happen).
func TestUpgrade_LogsStreamMigrationsAndOldFiles(t *testing.T) {
	dir := extractFixture(t, "v-1f1d424")
	b, err := os.ReadFile(filepath.Join(dir, "expected.json"))
	require.NoError(t, err)
	var exp upgradeExpected
	require.NoError(t, json.Unmarshal(b, &exp))
	var logs syncBuffer
	ts := startServer(t, server.Config{DataDir: dir, Log: zerolog.New(&logs)})
	ctx := ctxT(t)
	s := stream(t, ts.login(t, exp.Tokens["project"]), "/mirror")
	info, err := client.Describe(ctx, s)
	require.NoError(t, err)
	require.Regexp(t, `"level":"info","project":"[^"]+","path":"/mirror","streamId":"`+info.StreamID+`","from":2,"to":\d+,"message":"upgraded a stream's schema"`, logs.String())
	migrations := strings.Count(logs.String(), "upgraded a stream's schema")
	require.Contains(t, logs.String(), "refreshed the summaries of streams after the directory's upgrade", "not said to be an unclean stop's")

	head := appendKiB(t, s, 50)
	r, err := client.Trim(ctx, s, head-10)
	require.NoError(t, err)
	require.Positive(t, r.Deleted)
	const warning = "trimmed a stream whose file an itxd before auto_vacuum made"
	require.Equal(t, 1, strings.Count(logs.String(), warning), "logs:\n%s", logs.String())
	require.Regexp(t, `"level":"warn","project":"[^"]+","path":"/mirror","file":"[^"]*`+info.StreamID+`\.db"`, logs.String())
	require.Contains(t, logs.String(), "PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
	_, err = client.Trim(ctx, s, head-5)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(logs.String(), warning), "once per stream")

	// Started again: the streams are at the current schema, nothing is logged as migrated; a
	// stream made by this build trims without the warning.
	ts.srv.Close(ctx)
	var again syncBuffer
	ts = startServer(t, server.Config{DataDir: dir, Log: zerolog.New(&again)})
	proj := ts.login(t, exp.Tokens["project"])
	mustAppend(t, stream(t, proj, "/mirror"), ev("note", `{}`))
	fresh := stream(t, proj, "/fresh")
	head = appendKiB(t, fresh, 50)
	_, err = client.Trim(ctx, fresh, head-10)
	require.NoError(t, err)
	require.NotContains(t, again.String(), "upgraded a stream's schema")
	require.NotContains(t, again.String(), warning)
	require.Positive(t, migrations)
}
