package itx

import "encoding/json"

// StreamInfo describes a stream.
type StreamInfo struct {
	Path              string
	StreamID          string
	HeadOffset        int64
	CreatedAt         int64 // epoch ms
	LastAppendAt      int64 // epoch ms
	SubscriptionCount int
	// HaltedSubscriptions and MaxLag say where the stream's consumers stand: subscriptions the
	// retry ladder halted, and the largest lag (head - confirmed) of a subscription or registered
	// reader. For a stream not loaded they are as of its last unload.
	HaltedSubscriptions int
	MaxLag              int64
	// Readers counts the registered readers (Stream.readers), as of its last unload too.
	Readers int
	// ParkedSubscriptions counts subscriptions parked because their receiver is absent (a
	// remote processor whose host is gone, a capability no longer mounted), as Readers.
	ParkedSubscriptions int
	// TrimmedThrough is the offset through which Stream.trim deleted the events (its stream/*
	// records kept); 0: nothing trimmed. Set by describe, not by list.
	TrimmedThrough int64
	// RetentionMaxAgeMs and RetentionMaxEvents are the stream's retention policy
	// (Stream.setRetention; 0: none). Set by describe, not by list.
	RetentionMaxAgeMs  int64
	RetentionMaxEvents int64
	// RetentionMaxBytes is the policy's size bound (0: none). Set by describe.
	RetentionMaxBytes int64
	Loaded            bool
	// Unavailable says why the stream cannot be served from its database ("": it can): its file
	// lost, damaged or one itxd may not open, as met by the last load or read since itxd started
	// (its calls answer unavailable naming the file), until it loads again. Set by list.
	Unavailable string
}

// StreamDiskUsage is the size of a stream's files on disk (database, write-ahead log and
// shared-memory file) when read (Streams.diskUsage).
type StreamDiskUsage struct {
	Path       string
	StreamID   string
	DiskBytes  int64
	HeadOffset int64
}

// AppendOptions qualify one append call; the zero value appends unconditionally.
type AppendOptions struct {
	// Conditional makes the call commit only if the head is ExpectedHeadOffset at commit time.
	Conditional        bool
	ExpectedHeadOffset int64
}

// AppendResult answers one append call.
type AppendResult struct {
	Offsets    []int64 // one per input event, in input order
	Duplicate  []bool  // true where an idempotency key matched an earlier event
	HeadOffset int64   // the head right after this call's events
	StreamID   string
}

// ScheduledEvent is a pending scheduled append: Event (named by its IdempotencyKey) is appended
// to the stream at DueAt (epoch ms), exactly once.
type ScheduledEvent struct {
	DueAt int64
	Event EventInput
}

// Query selects a page of events.
type Query struct {
	After            int64
	Before           int64 // exclusive; 0 = no bound
	Limit            int   // 0 = DefaultPageLimit
	Types            []string
	IncludeEphemeral bool
	// Subscription reads as that subscription of the stream is delivered ("": none): its filter
	// (types and condition) applies on top of Types, and no ephemeral event is read. NextAfter
	// passes what the filter drops, so a remote processor host pages its frames with it.
	Subscription string
}

// Page is the reader's envelope.
type Page struct {
	Events          []Event
	StreamID        string
	StreamMaxOffset int64
	NextAfter       int64 // pass as After to continue, past filtered-out events too
}

// Predicate is waitForEvent's one-shot match. Every part that is set must hold.
type Predicate struct {
	Types            []string        // empty or containing "*": any type
	PayloadContains  json.RawMessage // the payload must contain this JSON value
	Where            string          // JSONata over the event; must evaluate to exactly true
	IncludeEphemeral bool
}

// MountInfo is a capability (a Receiver or a ProcessorHost) mounted under a name in a project.
type MountInfo struct {
	Name      string
	MountedAt int64           // epoch ms
	Contracts []ProcessorInfo // a processor host's announced contracts
	// Scope is the stream prefix of the session that mounted it ("": a whole-project session).
	// Mounts are namespaced by it: a subscription reaches only the mounts of its own Scope.
	Scope string
}

// ProjectInfo describes the project a token logged into.
type ProjectInfo struct {
	ID         string
	Name       string
	Deployment bool // the deployment root: its streams are global
}

// ReaderInfo is a registered reader: a named checkpoint whose lag (head - checkpoint) is visible.
type ReaderInfo struct {
	Name       string
	Checkpoint int64
	Lag        int64
	UpdatedAt  int64 // epoch ms
}
