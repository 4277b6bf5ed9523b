// Package processors is the stream-processor SDK: a processor is a Contract (name, consumed event
// types, reducer version, initial state, a pure Reduce and a ProcessEvent that causes side
// effects), driven by a Runner one event at a time, hosted by a Registry that keeps a keepalive
// alarm ahead of in-flight work and revives processors that died owing work.
//
// The doctrine is seeds/002 ("Writing and testing stream processors"): ProcessEvent's
// asynchronous work picks a guarantee deliberately, BlockProcessorWhile (at-least-once: the
// progress commit waits for it, a crash redelivers) or RunInBackground (at-most-once: an eviction
// loses it, so something else must recover the outcome, usually the caught-up pass restarting
// obligations from the reduced state).
//
// The package imports the module root vocabulary and the standard library only, so the same
// contract runs inside itxd or in a separate process. A host supplies the small interfaces in
// host.go: a StreamLog (read and append), a ProgressStore (the fenced progress record), a KV
// (keepalive records, below the reduction) and an AlarmCell (the processors' slice of the
// stream's alarm). processors/testing provides in-memory ones and the scenario harness.
package processors
