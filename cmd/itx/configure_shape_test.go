package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// configure takes the configured event's own shape (itx.SubscriptionConfig as itxd stores it,
// the seed's vocabulary: receiver.action, receivingStreamPath, jsonataTransform, receiver.delivery,
// filter.eventTypes, filter.jsonataCondition) beside the prompt's shorthand. It refused filter
// ("unknown option") and receivingStreamPath, though a raw append of the same payload worked.
func TestEval_ConfigureTakesTheConfiguredEventsShape(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/shape"); a.append([{type: "note", payload: {n: 1}}, {type: "other"}, {type: "note", payload: {n: 2}}])`)

	born := obj(t, s.mustEval(t, `a.subscriptions.configure({name: "m",
		receiver: {action: "copy-to-stream", receivingStreamPath: "/shape-copy", jsonataTransform: "$merge([$, {'payload': {'m': payload.n * 10}}])",
			delivery: {start: "beginning", onFailingEvent: "halt"}},
		filter: {eventTypes: ["note"], jsonataCondition: "payload.n > 1"}})`))
	require.Equal(t, "m", born["name"])
	d := obj(t, s.mustEval(t, `a.subscriptions.get("m").describe().config`))
	require.Equal(t, map[string]any{"type": "copy-to-stream", "path": "/shape-copy"}, d["receiver"])
	require.Equal(t, []any{"note"}, d["filterTypes"])
	require.Equal(t, "payload.n > 1", d["filterCondition"])
	require.Contains(t, d["transform"], "payload.n * 10")
	s.mustEval(t, `a.subscriptions.get("m").waitUntilProcessed({offset: 4, timeoutMs: 20000})`)
	require.Equal(t, []any{20.0}, arr(t, s.mustEval(t, `project.streams.get("/shape-copy").getEvents().map(e => e.payload.m)`)),
		"the filter's types and condition and the transform all took")

	// The rest of receiver.delivery, on a receiver that may skip.
	s.mustEval(t, `a.subscriptions.configure({name: "call", receiver: {action: "itx-call", capability: "inbox",
		delivery: {start: "now", onFailingEvent: "skip", deadLetterPath: "/shape-dead"}}})`)
	d = obj(t, s.mustEval(t, `a.subscriptions.get("call").describe().config`))
	require.Equal(t, "now", d["start"])
	require.Equal(t, "skip", d["onFailingEvent"])
	require.Equal(t, "/shape-dead", d["deadLetterPath"])
}

// A config read back, from the configured event itxd stored or from describe(), configures again
// as it is: the same config, so configure appends nothing and answers the original offset. One
// of each receiver kind, each with every field its shape can carry.
func TestEval_ConfigureRoundTrips(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/trip"); a.append({type: "note"})`)
	for name, cfg := range map[string]string{
		"hook": `{receiver: {type: "webhook-post", url: "http://127.0.0.1:9/h", headers: {"X-A": "1", "X-B": "2"}, secret: "whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ="},
			filterTypes: ["never"], filterCondition: "payload.n > 1", transform: "payload", start: "now", onFailingEvent: "skip",
			deadLetterPath: "/trip-dead", description: "a hook", maxDeliveryEvents: 5, maxDeliveryBytes: 4096, confirmWindow: 10}`,
		"copy": `{receiver: {type: "copy-to-stream", path: "/trip-copy"}, filterTypes: ["never"], transform: "$", description: "a copy", maxDeliveryEvents: 2}`,
		"call": `{receiver: {type: "itx-call", capability: "inbox"}, filterCondition: "false", start: "now", confirmWindow: 3}`,
		"wake": `{receiver: {type: "processor-wake", placement: "remote", processor: "counter"}, filterTypes: ["never"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			born := obj(t, s.mustEval(t, fmt.Sprintf(`a.subscriptions.configure(Object.assign({name: %q}, %s))`, name, cfg)))
			head := obj(t, s.mustEval(t, `a.describe()`))["headOffset"]
			stored := fmt.Sprintf(`a.getEvents({types: "stream/subscription-configured"}).filter(e => e.offset == %v)[0].payload`, born["offset"])
			for what, src := range map[string]string{
				"the stored event's payload": `a.subscriptions.configure(` + stored + `)`,
				"describe's config":          fmt.Sprintf(`a.subscriptions.configure(a.subscriptions.get(%q).describe().config)`, name),
			} {
				again := obj(t, s.mustEval(t, src))
				require.Equal(t, born, again, "%s configures the same subscription again, unchanged", what)
			}
			require.Equal(t, head, obj(t, s.mustEval(t, `a.describe()`))["headOffset"], "nothing was appended")
		})
	}
}

// A field given under both its names (the prompt's and the configured event's) must say the same
// under each: two values are refused, naming both, rather than one silently winning. Keys that
// neither shape has where they stand are refused by name.
func TestEval_ConfigureRefusesConflictingSpellings(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var a = project.streams.get("/both"); a.append({type: "note"})`)
	copyTo := `receiver: {type: "copy-to-stream", path: "/both-copy"}`
	for src, want := range map[string]string{
		`a.subscriptions.configure({name: "x", ` + copyTo + `, filterTypes: ["a"], filter: {eventTypes: ["b"]}})`:                       `configure: filterTypes ["a"] and filter.eventTypes ["b"] differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, filterCondition: "true", filter: {jsonataCondition: "false"}})`:          `configure: filterCondition "true" and filter.jsonataCondition "false" differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", receiver: {type: "copy-to-stream", path: "/p", receivingStreamPath: "/q"}})`:             `configure: receiver.path "/p" and receiver.receivingStreamPath "/q" differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", receiver: {type: "copy-to-stream", action: "itx-call", path: "/p"}})`:                    `configure: receiver.type "copy-to-stream" and receiver.action "itx-call" differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", receiver: {type: "copy-to-stream", path: "/p", jsonataTransform: "a"}, transform: "b"})`: `configure: transform "b" and receiver.jsonataTransform "a" differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", receiver: {type: "itx-call", capability: "c", delivery: {start: "now", onFailingEvent: "skip", deadLetterPath: "/d"}}, start: "beginning", onFailingEvent: "halt", deadLetterPath: "/e"})`: `configure: start "beginning" and receiver.delivery.start "now" differ: they name one thing, give one of them; ` +
			`onFailingEvent "halt" and receiver.delivery.onFailingEvent "skip" differ: they name one thing, give one of them; deadLetterPath "/e" and receiver.delivery.deadLetterPath "/d" differ: they name one thing, give one of them`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, scope: "/both"})`:                                                                                     `configure: scope is not an option here: itxd records the scope of the token that configures (this session's) and takes none from the caller; leave it out (a whole-project token places a subscription in another scope by appending its stream/subscription-configured event)`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, delivery: {start: "now"}})`:                                                                           `configure: delivery is not an option here: the configured event keeps it in the receiver: receiver: {..., delivery: {start, onFailingEvent, deadLetterPath}}, or give start, onFailingEvent and deadLetterPath at the top`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, filter: {types: ["a"]}})`:                                                                             `configure: filter: unknown option "types" (known: eventTypes, jsonataCondition)`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, filter: {eventTypes: []}})`:                                                                           `configure: filter: eventTypes: must list at least one type (or "*")`,
		`a.subscriptions.configure({name: "x", ` + copyTo + `, filter: "note"})`:                                                                                     `configure: filter: expected an options object {eventTypes, jsonataCondition}, got a string`,
		`a.subscriptions.configure({name: "x", receiver: {action: "copy-to-stream", receivingStreamPath: "bad"}})`:                                                   `configure: receiver: receivingStreamPath: stream path "bad" must start with /`,
		`a.subscriptions.configure({name: "x", receiver: {action: "copy-to-stream", receivingStreamPath: "/p", delivery: {start: "now", includeEphemeral: false}}})`: `configure: receiver.delivery: unknown option "includeEphemeral" (known: start, onFailingEvent, deadLetterPath)`,
		`a.subscriptions.configure({name: "x", receiver: {action: "email"}})`:                                                                                        `configure: receiver.action must be "webhook-post", "copy-to-stream", "itx-call" or "processor-wake", got "email"`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Equal(t, want, f.Message, src)
	}
	require.Empty(t, arr(t, s.mustEval(t, `a.subscriptions.list()`)), "nothing was configured")

	// The same value under both names is one value.
	s.mustEval(t, `a.subscriptions.configure({name: "x", receiver: {type: "copy-to-stream", action: "copy-to-stream", path: "/both-copy", receivingStreamPath: "/both-copy"},
		filterTypes: "note", filter: {eventTypes: ["note"]}, start: "now"})`)
	d := obj(t, s.mustEval(t, `a.subscriptions.get("x").describe().config`))
	require.Equal(t, []any{"note"}, d["filterTypes"])
	require.Equal(t, "now", d["start"])
}
