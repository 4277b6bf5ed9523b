package processors

import (
	"context"
	"encoding/json"
	"time"

	"github.com/itx-dev/itx"
)

// StreamLog is the processor's home stream as the runner needs it.
type StreamLog interface {
	// Read returns up to limit durable events after offset after, in offset order. Ephemeral
	// events may be omitted or included (the runner drops them); the page's ScannedThrough says
	// how far the read looked, so a page of filtered rows still proves progress.
	Read(ctx context.Context, after int64, limit int) (Page, error)
	// Append commits events atomically. A key already committed with the same body returns the
	// committed event; with another body it fails with itx.EIdempotencyConflict.
	Append(ctx context.Context, events []itx.EventInput) ([]itx.Event, error)
}

// Page is one read of a StreamLog.
type Page struct {
	Events         []itx.Event
	ScannedThrough int64 // every offset in (after, ScannedThrough] was examined
	Head           int64 // the stream's highest offset when the page was read
}

// Frame is one delivery to a runner: the events of a scanned range (possibly filtered to the
// consumed types) and where the stream's head was. The scanned range, not the events, is what
// moves the cursor and tells the runner whether it reached the head.
type Frame struct {
	Events         []itx.Event
	ScannedAfter   int64 // the frame covers offsets (ScannedAfter, ScannedThrough]
	ScannedThrough int64
	Head           int64 // the stream's highest offset when the frame was produced
}

// Progress is a processor's durable record: the reduction (a disposable cache of Reduce over
// the stream, keyed by ReducerVersion) and the processing cursor (authoritative: every effect at
// or below ProcessedThrough is settled). Both are committed together, once per frame.
type Progress struct {
	ReducerVersion   string          `json:"reducerVersion"`
	ReducedThrough   int64           `json:"reducedThrough"`
	State            json.RawMessage `json:"state"`
	ProcessedThrough int64           `json:"processedThrough"`
	// CursorRevision counts operator rewinds (ReprocessFrom); it is the only sanctioned way for
	// ProcessedThrough to move backward.
	CursorRevision int64 `json:"cursorRevision"`
}

// ProgressStore keeps one Progress per processor name, fenced by incarnation: Claim starts an
// incarnation and a commit from any earlier one fails. In itxd the record is written through the
// stream's single writer.
type ProgressStore interface {
	// Claim bumps the name's generation and returns its record (nil when none) and the
	// generation this incarnation's commits must carry.
	Claim(ctx context.Context, name string) (*Progress, int64, error)
	// Commit replaces the record if the stored generation is still generation; otherwise it
	// fails with itx.EFailedPrecondition and writes nothing.
	Commit(ctx context.Context, name string, generation int64, p Progress) error
}

// KV is per-stream storage below the reduction: keepalive and crash-loop records live here so a
// poisoned reducer cannot be asked to reduce its own pause.
type KV interface {
	// Get returns the value under key, or ok false.
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	Put(ctx context.Context, key string, value []byte) error
}

// AlarmCell is the processors' slice of the stream's alarm. The host calls
// Registry.HandleAlarm once the armed time has come, also in a fresh process after a crash.
type AlarmCell interface {
	// SetAlarm arms the slice at at; the zero time disarms it.
	SetAlarm(ctx context.Context, at time.Time) error
}
