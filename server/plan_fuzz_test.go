package server

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/itx-dev/itx"
)

// FuzzPlanGroup feeds a client's appends (any type, stream/* control events included, any
// payload and key) through the planner and the core reducer, after the append's Normalize as
// the server runs it. Properties: a refusal is a typed error other than internal and writes
// nothing; the rows planned are exactly the accepted requests' new events, at consecutive
// offsets; the core state planned is the one a re-reduction of the log rebuilds, and survives
// its checkpoint's JSON; a keyed request retried is answered as a duplicate with its offsets.
func FuzzPlanGroup(f *testing.F) {
	cfg := itx.TypeSubscriptionConfigured
	for _, s := range []struct {
		t1, p1, k1, t2, p2, k2, t3, p3 string
	}{
		{"note", `{}`, "k", "note", `{"a":1}`, "", "note", `{}`},
		{cfg, `{"name":"n","receiver":{"action":"itx-call","capability":"c"}}`, "k", cfg, `{"name":"sub","receiver":{"action":"itx-call","capability":"d"}}`, "k2", itx.TypeSubscriptionRemoved, `{"name":"copy","reason":"requested"}`},
		{cfg, `{"receiver":{"action":"copy-to-stream","receivingStreamPath":"/s"}}`, "", cfg, `{"name":"subscription:1","receiver":{"action":"itx-call","capability":"c"}}`, "", "note", `{}`},
		{itx.TypeSubscriptionCursorSet, `{"name":"sub","afterOffset":2}`, "k", itx.TypeSubscriptionCursorSet, `{"name":"sub","afterOffset":99}`, "", "note", `{}`},
		{itx.TypeSubscriptionResumed, `{"name":"sub"}`, "", itx.TypeSubscriptionHalted, `{"name":"sub","reason":"x"}`, "", itx.TypeWoken, `{}`},
		{itx.TypeErrorOccurred, `{"message":" "}`, "", itx.TypeProcessorRevived, `{"processorSlug":"sub"}`, "", "stream/nope", `{}`},
		{cfg, `{"name":"sub","receiver":{"action":"itx-call","capability":"c","delivery":{"start":"now","onFailingEvent":"halt"}}}`, "", cfg, `{"name":"p","receiver":{"action":"processor-wake"}}`, "k", cfg, `{"name":"p","receiver":{"action":"processor-wake","placement":"facet"}}`},
		{"note", `{}`, "k", "note", `{"a":2}`, "k", "note", `{}`},
		{cfg, `{"name":"d","receiver":{"action":"webhook-post","url":"http://h","delivery":{"start":"now","onFailingEvent":"skip","deadLetterPath":"/s"}}}`, "", "note", `{}`, "", "note", `{}`},
	} {
		f.Add(s.t1, []byte(s.p1), s.k1, s.t2, []byte(s.p2), s.k2, s.t3, []byte(s.p3))
	}
	now := time.Unix(1000, 0)
	f.Fuzz(func(t *testing.T, t1 string, p1 []byte, k1, t2 string, p2 []byte, k2, t3 string, p3 []byte) {
		events := []itx.EventInput{{Type: t1, Payload: p1, IdempotencyKey: k1}, {Type: t2, Payload: p2, IdempotencyKey: k2}, {Type: t3, Payload: p3}}
		for i := range events {
			if events[i].Normalize() != nil {
				return // refused before the actor sees it
			}
		}
		rc := testRC()
		bucket := newTokenBucket(itx.BreakerBurst, itx.BreakerRefillPerMinute, now)
		// The stream already holds a subscription "sub" and a copy "copy" for the control
		// events to name.
		setup := planGroup(0, "sid", bucket, nil, newCoreState(), rc, []*appendReq{req(itx.AppendOptions{},
			in(cfg, `{"name":"sub","receiver":{"action":"itx-call","capability":"c"}}`, ""),
			in(cfg, `{"name":"copy","receiver":{"action":"copy-to-stream","receivingStreamPath":"/t"}}`, ""))}, nil, now)
		if setup.Replies[0].err != nil {
			t.Fatal(setup.Replies[0].err)
		}
		log := append([]itx.Event(nil), setup.Events...)
		committed := map[string]*itx.Event{}
		reqs := []*appendReq{req(itx.AppendOptions{}, events[0]), req(itx.AppendOptions{}, events[1], events[2])}
		p := planGroup(setup.Head, "sid", bucket, nil, setup.Core, rc, reqs, committed, now)
		checkPlan(t, setup.Head, reqs, p)
		log = append(log, p.Events...)
		for i := range p.Events {
			if k := p.Events[i].IdempotencyKey; k != "" {
				committed[k] = &p.Events[i]
			}
		}
		// A retry of a request that was accepted with a key on every event is all duplicates.
		retry := planGroup(p.Head, "sid", bucket, nil, p.Core, rc, reqs, committed, now)
		checkPlan(t, p.Head, reqs, retry)
		for i, r := range reqs {
			keyed := true
			for _, e := range r.inputs {
				keyed = keyed && e.IdempotencyKey != ""
			}
			if !keyed || p.Replies[i].err != nil {
				continue
			}
			got := retry.Replies[i]
			if got.err != nil || !reflect.DeepEqual(got.result.Offsets, p.Replies[i].result.Offsets) {
				t.Fatalf("retry of request %d: %v, offsets %v, want %v", i, got.err, got.result.Offsets, p.Replies[i].result.Offsets)
			}
			for j, dup := range got.result.Duplicate {
				if !dup {
					t.Fatalf("retry of request %d: event %d is not a duplicate", i, j)
				}
			}
		}
		log = append(log, retry.Events...)
		// What the planner reduced is what a re-reduction of the log rebuilds.
		replay := newCoreState()
		replayRC := rc
		replayRC.parked = func(string) bool { return true }
		for i := range log {
			replayRC.head, replayRC.authority = log[i].Offset-1, authCore
			if _, err := replay.reduce(&log[i], &replayRC); err != nil {
				t.Fatalf("replaying accepted offset %d (%s %s): %v", log[i].Offset, log[i].Type, log[i].Payload, err)
			}
		}
		want, err := json.Marshal(retry.Core)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := json.Marshal(replay); string(got) != string(want) {
			t.Fatalf("re-reduction differs from the planned state:\n%s\n%s", got, want)
		}
		back, ok := decodeCoreState(want)
		if !ok {
			t.Fatalf("checkpoint %s does not decode", want)
		}
		if got, _ := json.Marshal(back); string(got) != string(want) {
			t.Fatalf("checkpoint changes through JSON:\n%s\n%s", got, want)
		}
	})
}

// checkPlan checks one planned group: typed refusals that write nothing, accepted requests'
// new rows at consecutive offsets after head.
func checkPlan(t *testing.T, head int64, reqs []*appendReq, p groupPlan) {
	t.Helper()
	var rows []itx.Event
	next := head
	for i, r := range p.Replies {
		if r.err != nil {
			var e *itx.Error
			if !errors.As(r.err, &e) || e.Code == itx.EInternal {
				t.Fatalf("request %d refused without a typed code: %T %v", i, r.err, r.err)
			}
			continue
		}
		for j, in := range reqs[i].inputs {
			if r.result.Duplicate[j] {
				continue
			}
			next++
			if r.result.Offsets[j] != next {
				t.Fatalf("request %d event %d at offset %d, want %d", i, j, r.result.Offsets[j], next)
			}
			rows = append(rows, itx.Event{Offset: next, Type: in.Type, Payload: in.Payload, IdempotencyKey: in.IdempotencyKey, Metadata: in.Metadata})
		}
	}
	if p.Head != next || len(p.Events) != len(rows) {
		t.Fatalf("planned head %d with %d rows, the accepted requests make head %d with %d", p.Head, len(p.Events), next, len(rows))
	}
	for i := range rows {
		e := p.Events[i]
		if e.Offset != rows[i].Offset || e.Type != rows[i].Type || string(e.Payload) != string(rows[i].Payload) || e.IdempotencyKey != rows[i].IdempotencyKey {
			t.Fatalf("planned row %d is %+v, want %+v", i, e, rows[i])
		}
	}
}
