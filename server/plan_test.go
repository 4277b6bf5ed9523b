package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

func in(typ, payload, key string) itx.EventInput {
	e := itx.EventInput{Type: typ, Payload: json.RawMessage(payload), IdempotencyKey: key}
	if err := e.Normalize(); err != nil {
		panic(err)
	}
	return e
}

func req(opts itx.AppendOptions, inputs ...itx.EventInput) *appendReq {
	return &appendReq{inputs: inputs, opts: opts}
}

// render prints a plan the way the expectations below are written.
func render(p groupPlan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "head=%d rows=", p.Head)
	for i, e := range p.Events {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%d", e.Offset)
	}
	for i, r := range p.Replies {
		if r.err != nil {
			fmt.Fprintf(&b, "\n%d: %s", i, itx.ErrorCode(r.err))
			continue
		}
		fmt.Fprintf(&b, "\n%d: offsets=%v dup=%v head=%d", i, r.result.Offsets, r.result.Duplicate, r.result.HeadOffset)
	}
	return b.String()
}

func TestPlanGroup(t *testing.T) {
	now := time.Unix(1000, 0)
	committed := map[string]*itx.Event{
		"k1": {Offset: 1, Type: "a", Payload: json.RawMessage(`{"x":1}`)},
	}
	for _, tc := range []struct {
		name string
		reqs []*appendReq
		want string
	}{
		{
			name: "independent requests share one commit, in order",
			reqs: []*appendReq{req(itx.AppendOptions{}, in("a", `{}`, "")), req(itx.AppendOptions{}, in("a", `{}`, ""), in("b", `{}`, ""))},
			want: "head=13 rows=11,12,13\n0: offsets=[11] dup=[false] head=11\n1: offsets=[12 13] dup=[false false] head=13",
		},
		{
			name: "a committed key with the same body returns the original offset",
			reqs: []*appendReq{req(itx.AppendOptions{}, in("a", `{"x":1}`, "k1"), in("b", `{}`, ""))},
			want: "head=11 rows=11\n0: offsets=[1 11] dup=[true false] head=11",
		},
		{
			name: "a committed key with another body refuses the whole call and only it",
			reqs: []*appendReq{req(itx.AppendOptions{}, in("b", `{}`, ""), in("a", `{"x":2}`, "k1")), req(itx.AppendOptions{}, in("c", `{}`, ""))},
			want: "head=11 rows=11\n0: idempotencyConflict\n1: offsets=[11] dup=[false] head=11",
		},
		{
			name: "a key repeated inside one call",
			reqs: []*appendReq{req(itx.AppendOptions{}, in("a", `{"y":1}`, "k2"), in("a", `{"y":1}`, "k2"))},
			want: "head=11 rows=11\n0: offsets=[11 11] dup=[false true] head=11",
		},
		{
			name: "a key taken earlier in the same group",
			reqs: []*appendReq{req(itx.AppendOptions{}, in("a", `{"y":1}`, "k2")), req(itx.AppendOptions{}, in("a", `{"y":1}`, "k2")), req(itx.AppendOptions{}, in("a", `{"y":2}`, "k2"))},
			want: "head=11 rows=11\n0: offsets=[11] dup=[false] head=11\n1: offsets=[11] dup=[true] head=11\n2: idempotencyConflict",
		},
		{
			name: "conditional appends see the group's running head",
			reqs: []*appendReq{
				req(itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 10}, in("a", `{}`, "")),
				req(itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 10}, in("a", `{}`, "")),
				req(itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 11}, in("a", `{}`, "")),
			},
			want: "head=12 rows=11,12\n0: offsets=[11] dup=[false] head=11\n1: offsetConflict\n2: offsets=[12] dup=[false] head=12",
		},
		{
			name: "a conditional retry whose events all committed is answered from the log",
			reqs: []*appendReq{req(itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 0}, in("a", `{"x":1}`, "k1"))},
			want: "head=10 rows=\n0: offsets=[1] dup=[true] head=10",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bucket := newTokenBucket(100, 60, now)
			p := planGroup(10, "sid", bucket, nil, newCoreState(), testRC(), tc.reqs, committed, now)
			require.Equal(t, tc.want, render(p))
			for _, e := range p.Events {
				require.Equal(t, now.UnixMilli(), e.CreatedAt)
			}
		})
	}
}

func TestPlanGroup_CircuitBreaker(t *testing.T) {
	now := time.Unix(1000, 0)
	bucket := newTokenBucket(3, 60, now) // burst 3, one token per second
	p := planGroup(0, "sid", bucket, nil, newCoreState(), testRC(), []*appendReq{
		req(itx.AppendOptions{}, in("a", `{}`, ""), in("a", `{}`, "")),
		req(itx.AppendOptions{}, in("a", `{}`, ""), in("a", `{}`, "")), // would exceed: refused whole
		req(itx.AppendOptions{}, in("a", `{}`, "")),
	}, nil, now)
	require.Equal(t, "head=3 rows=1,2,3\n0: offsets=[1 2] dup=[false false] head=2\n1: rateLimited\n2: offsets=[3] dup=[false] head=3", render(p))

	p = planGroup(3, "sid", bucket, nil, newCoreState(), testRC(), []*appendReq{req(itx.AppendOptions{}, in("a", `{}`, ""))}, nil, now)
	require.Equal(t, itx.ERateLimited, itx.ErrorCode(p.Replies[0].err), "empty bucket")
	p = planGroup(3, "sid", bucket, nil, newCoreState(), testRC(), []*appendReq{req(itx.AppendOptions{}, in("a", `{}`, ""))}, nil, now.Add(time.Second))
	require.NoError(t, p.Replies[0].err, "refilled after a second")
}

func TestTokenBucket(t *testing.T) {
	start := time.Unix(0, 0)
	b := newTokenBucket(10, 600, start) // 10 per second
	require.True(t, b.take(10, start))
	require.False(t, b.take(1, start))
	require.True(t, b.take(5, start.Add(500*time.Millisecond)))
	require.False(t, b.take(1, start.Add(500*time.Millisecond)))
	require.True(t, b.take(10, start.Add(time.Hour)), "refill caps at burst")
	require.False(t, b.take(11, start.Add(2*time.Hour)), "never more than burst")
}

func TestContainsJSON(t *testing.T) {
	for _, tc := range []struct {
		v, pattern string
		want       bool
	}{
		{`{"a":1,"b":{"c":"x","d":2}}`, `{"b":{"c":"x"}}`, true},
		{`{"a":1}`, `{"a":1.0}`, true},
		{`{"a":100}`, `{"a":1e2}`, true},
		{`{"a":9007199254740993}`, `{"a":9007199254740992}`, false}, // one float64, two numbers
		{`{"a":1}`, `{"a":"1"}`, false},
		{`{"a":[1,2,3]}`, `{"a":[3,1]}`, true},
		{`{"a":[1,2]}`, `{"a":[4]}`, false},
		{`{"a":null}`, `{"a":null}`, true},
		{`{"a":false}`, `{"a":null}`, false},
		{`{"a":1}`, `{"b":1}`, false},
		{`{"a":true}`, `{"a":true}`, true},
	} {
		v, err := decodeJSON([]byte(tc.v))
		require.NoError(t, err)
		p, err := decodeJSON([]byte(tc.pattern))
		require.NoError(t, err)
		require.Equal(t, tc.want, containsJSON(v, p), "%s contains %s", tc.v, tc.pattern)
	}
}

func TestEvalCondition(t *testing.T) {
	e := &itx.Event{Offset: 7, Type: "order", Payload: json.RawMessage(`{"total":12,"items":["a","b"]}`)}
	for _, tc := range []struct {
		expr string
		want bool
	}{
		{`payload.total > 10`, true},
		{`payload.total > 20`, false},
		{`type = "order" and offset = 7`, true},
		{`payload.missing`, false}, // undefined is not true
		{`payload.total`, false},   // truthy but not exactly true
		{`$count(payload.items) = 2`, true},
	} {
		expr, err := CompileJSONata(tc.expr)
		require.NoError(t, err)
		got, err := EvalCondition(expr, e)
		require.NoError(t, err, tc.expr)
		require.Equal(t, tc.want, got, tc.expr)
	}
	_, err := CompileJSONata(`payload.(`)
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err))
}

func testRC() reduceContext {
	return reduceContext{path: "/s", projectID: "p", maxSubs: itx.MaxSubscriptionsPerStream,
		compile: func(src string) error { _, err := CompileJSONata(src); return err }}
}

// TestReduceConfigured_NewRulesForNewConfigsOnly: a client's configure meets the rules that came
// after configs were first stored (filter types an event can have, one header per name
// whatever its case), while a rebuild from the log keeps a subscription stored before them.
func TestReduceConfigured_NewRulesForNewConfigsOnly(t *testing.T) {
	for _, payload := range []string{
		`{"name":"f","filter":{"eventTypes":["order placed"]},"receiver":{"action":"itx-call","capability":"c"}}`,
		`{"name":"h","receiver":{"action":"webhook-post","url":"http://h","headers":{"X-A":"1","x-a":"2"}}}`,
	} {
		e := itx.Event{Offset: 1, Type: itx.TypeSubscriptionConfigured, Payload: json.RawMessage(payload)}
		rc := testRC()
		_, err := newCoreState().reduce(&e, &rc)
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), payload)

		st := newCoreState()
		rc.authority = authCore
		_, err = st.reduce(&e, &rc)
		require.NoError(t, err, payload)
		require.Len(t, st.Subscriptions, 1, "history is replayed as it was accepted")
	}
}

// A configure that repeats a subscription's config under an idempotency key is written (inert),
// not answered with the birth event as an unkeyed repeat is: its key is kept, so the same key
// with another body is a conflict, and the same key and body a duplicate of it.
func TestPlanGroup_KeyedIdenticalConfigureKeepsItsKey(t *testing.T) {
	ctx := context.Background()
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir()})
	ref := StreamRef{ProjectID: projectID, Path: "/keyed-configure"}
	cfg := `{"name":"hook","receiver":{"action":"webhook-post","url":"https://example.com/hook"}}`
	configure := itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: json.RawMessage(cfg)}
	first, err := s.Append(ctx, ref, []itx.EventInput{configure}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, first.Duplicate)

	again, err := s.Append(ctx, ref, []itx.EventInput{configure}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, first.Offsets, again.Offsets, "an unkeyed repeat answers with the birth event")
	require.Equal(t, []bool{true}, again.Duplicate)

	keyed := configure
	keyed.IdempotencyKey = "ensure-hook"
	written, err := s.Append(ctx, ref, []itx.EventInput{keyed}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, []bool{false}, written.Duplicate, "a keyed repeat is written")
	require.Equal(t, first.HeadOffset+1, written.Offsets[0])

	retry, err := s.Append(ctx, ref, []itx.EventInput{keyed}, itx.AppendOptions{})
	require.NoError(t, err)
	require.Equal(t, written.Offsets, retry.Offsets)
	require.Equal(t, []bool{true}, retry.Duplicate)

	_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "a", Payload: json.RawMessage(`{}`), IdempotencyKey: "ensure-hook"}}, itx.AppendOptions{})
	require.Equal(t, itx.EIdempotencyConflict, itx.ErrorCode(err), "%v", err)
}
