package itx

import "time"

// The seed system's values, kept in one place. Changing one is a product decision: each is
// documented in DESIGN.md ("Constants") or in the README.
const (
	// MaxEventBytes bounds one event: type + payload + metadata + idempotency key.
	MaxEventBytes = 1 << 20
	// MaxAppendEvents and MaxAppendBytes bound one append call (one atomic batch).
	MaxAppendEvents = 1000
	MaxAppendBytes  = 8 << 20
	// MaxJSONDepth bounds how deep an event's payload or metadata nests (objects and arrays).
	// Every envelope an event travels in (a webhook body, a dead letter, an export line, a
	// scheduled row) holds it a few levels deeper, and receivers' JSON decoders stop at their
	// own depth (Go's at 10,000): an event at the bound still decodes wherever it goes.
	MaxJSONDepth = 1000
	// MaxTypeLength bounds an event type.
	MaxTypeLength = 256
	// MaxIdempotencyKeyLength bounds an idempotency key.
	MaxIdempotencyKeyLength = 512
	// MaxScheduledPerStream is the default bound on one stream's pending scheduled appends
	// (itxd's --max-scheduled-per-stream); processors/testing's stream keeps it too, so a
	// processor that leaves timers behind meets the bound in its tests, not first in production.
	MaxScheduledPerStream = 10_000
	// MaxPathLength bounds a stream path; MaxPathSegments its depth.
	MaxPathLength   = 1024
	MaxPathSegments = 32

	// MaxJSONataLength bounds a JSONata expression (conditions, transforms, predicates).
	MaxJSONataLength = 16 << 10
	// MaxJSONataArrayItems bounds an array (or range) one JSONata built-in may build; strings are
	// bounded by MaxEventBytes.
	MaxJSONataArrayItems = 100_000
	// MaxJSONataItems and MaxJSONataBytes bound everything one evaluation builds, in total: array
	// items and object entries, and string bytes, across all intermediate values.
	MaxJSONataItems = 500_000
	MaxJSONataBytes = 16 << 20

	// EphemeralBufferBytes bounds the ephemeral events one stream holds (type, payload and
	// metadata bytes): past it the oldest are evicted first (FIFO), before their retention ends.
	EphemeralBufferBytes = 10 << 20

	// MaxWebhookSecretBytes bounds a webhook signing key (Standard Webhooks keys are 24 to 64
	// bytes); MaxSecretsPerProject the distinct secrets a project keeps (each stored apart from
	// the log, in the directory and in memory).
	MaxWebhookSecretBytes = 64
	MaxSecretsPerProject  = 10_000

	// MaxStreamsPerProject bounds the streams one project holds, each its own SQLite file and
	// directory entry (--max-streams-per-project).
	MaxStreamsPerProject = 100_000

	// MaxTokensPerProject bounds the tokens one project holds (each a directory row, an audit
	// event, a row of every listTokens reply) (--max-tokens-per-project).
	MaxTokensPerProject = 10_000

	// DefaultPageLimit is the getEvents page size when none is asked for, and its maximum.
	DefaultPageLimit = 500
	MaxPageLimit     = 500
	// MaxPageBytes bounds a getEvents page by size as well (Event.Size): it ends after the event
	// that brings it to MaxPageBytes or more, so a page holds at most MaxPageBytes plus one event
	// (the first event always goes). NextAfter then says where to continue.
	MaxPageBytes = 4 << 20

	// DefaultWaitTimeout applies to waitForEvent and waitUntilProcessed when none is given.
	DefaultWaitTimeout = 20 * time.Second
	// MaxWaitTimeout bounds a barrier so a forgotten caller cannot pin a stream forever.
	MaxWaitTimeout = 10 * time.Minute

	// IdleActorTeardown unloads a stream actor nobody has used for this long.
	IdleActorTeardown = 5 * time.Minute

	// Circuit breaker defaults: a token bucket per stream, in events.
	BreakerBurst           = 100_000
	BreakerRefillPerMinute = 6_000_000
)

// ErrAppendTooManyEvents and ErrAppendTooLarge are the refusals of an append past
// MaxAppendEvents or MaxAppendBytes (measured with EventInput.Size after Normalize), as itxd
// answers them and the Go client gives them before sending.
func ErrAppendTooManyEvents(n int) error {
	return Errorf(ETooLarge, "append has %d events, at most %d", n, MaxAppendEvents)
}

func ErrAppendTooLarge(bytes int) error {
	return Errorf(ETooLarge, "append is %d bytes, at most %d", bytes, MaxAppendBytes)
}
