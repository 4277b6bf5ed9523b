package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A processor-wake subscription owns no delivery policy: the processor keeps its own checkpoint
// (the seed's receiver union has no delivery field on that arm). A start or failing-event policy
// asked of one is refused, writing nothing, instead of being dropped on the way: a processor
// asked to start "now" would otherwise run every effect over the whole history.
func TestEval_ProcessorWakeRefusesADeliveryPolicy(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var pw = project.streams.get("/pw"); pw.append({type: "note"})`)
	for _, src := range []string{
		`pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, start: "now"})`,
		`pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, onFailingEvent: "skip"})`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, "%s: %s", src, f.Message)
		require.Contains(t, f.Message, "processor-wake", src)
	}
	require.Equal(t, 1.0, s.mustEval(t, `pw.describe().headOffset`), "a refused configure writes nothing")
	require.Empty(t, arr(t, s.mustEval(t, `pw.subscriptions.list()`)))

	// The defaults, spelled out, are what a processor does anyway.
	born := obj(t, s.mustEval(t, `pw.subscriptions.configure({name: "guestbook", receiver: {type: "processor-wake"}, start: "beginning", onFailingEvent: "halt"})`))
	require.Equal(t, 2.0, born["offset"])
}
