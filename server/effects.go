package server

import (
	"time"

	"github.com/itx-dev/itx/storage"
)

// effects is what one step asks of the actor. The actor applies the fields in the order they are
// declared, and that order is the contract (as in etcd raft's Ready: persist before send):
//
//  1. createStream, markStale, alarmNow: directory marks that must hold before the commit, so a
//     crash right after it leaves the restarted server owing this stream a load and a summary.
//  2. commit: the one SQLite transaction (events, cursor rows, core checkpoint). It is durable
//     before anything below happens. If it fails, every reply that named offsets becomes that
//     failure, nothing below is done, and the actor reloads its state from storage.
//  3. publish: readers, barriers and waiters see the new head, core state and rows.
//  4. replies: appenders, reader and processor port writers learn their outcome (commit before
//     reply).
//  5. rebuild, then pushes: deliverers are rebuilt for changed subscriptions, then the delivery
//     tries start (commit before push: a push never reads an event that could still be lost).
//  6. wakeAt, flushAfter, fireProcAlarms, stepAgain: timers for the next retry and for writing
//     dirty cursor rows, the processors' alarm fire, and another step at once.
type effects struct {
	createStream bool
	markStale    bool
	alarmNow     bool

	commit      storage.Commit
	coreChanged bool
	flushed     bool // the commit carries every dirty row
	// born: the commit is the stream's first (it carries bornKey); once it landed, the directory
	// lists the stream (NoteStreamHead), even at head 0.
	born bool

	rowsChanged bool // publish a new copy of the rows
	confirmed   bool // a Subscription.confirm moved a cursor: written before it is answered
	// retryCleared: a success cleared a row's retry block (attempts, failing event, skips): written
	// at once, as the failure that set it was, so a crash does not bring the block back.
	retryCleared bool

	replies       []replyBatch
	readerReplies []readerReply
	procAnswers   []procAnswer
	// scheduleAnswers answer schedule and cancel calls, after the commit.
	scheduleAnswers []scheduleAnswer

	rebuild []string
	pushes  []pushJob
	// forgetProcs are the processor-wake subscriptions removed in this step, or replaced by a
	// new start of another kind (or made from one): their processor records (progress, KV,
	// alarm slice) are reset in the same commit.
	forgetProcs []string
	// recountProcKV asks the actor to recount the processors' KV after the commit (a prefix was
	// deleted: the step cannot size it).
	recountProcKV bool

	wakeAt         int64         // epoch ms of the earliest retry (or processor alarm) due; 0: none
	fireProcAlarms []string      // processor alarm slices that came due: fire each off the actor
	flushAfter     time.Duration // write dirty rows after this if nothing else does; 0: nothing dirty
	stepAgain      bool          // take another step at once (scheduled appends due that this one left)

	lateOutcomes int // fenced outcomes (a metric)
	// failedKinds is the receiver kind of each failed delivery try the step took (a metric,
	// counted whether or not the step commits: the try failed either way).
	failedKinds []string
	// ladder is the retry ladder's loud decisions (halt, skip, park), logged and counted once
	// the step has committed: a decision whose commit fails is made again after the reload.
	ladder []ladderNote
}

// ladderNote is one loud ladder decision, for the operator's log and metrics.
type ladderNote struct {
	name     string
	decision decisionKind
	offset   int64 // the skipped event; for a halt, the confirmed offset delivery stops after
	attempts int
	msg      string
	// deadLetter is, for a skip, the stream its dead letter landed in (empty: none).
	deadLetter string
}

type scheduleAnswer struct {
	op    scheduleOp
	reply scheduleReply
}

// replyBatch pairs a planned group with the requests it answers.
type replyBatch struct {
	group []*appendReq
	plan  groupPlan
}

// hasWrites reports whether the step must commit.
func (e *effects) hasWrites() bool {
	c := &e.commit
	return len(c.Events) > 0 || len(c.CursorUpserts) > 0 || len(c.CursorDeletes) > 0 || len(c.KV) > 0 ||
		len(c.KVDeletes) > 0 || len(c.KVDeletePrefixes) > 0 ||
		len(c.ReaderUpserts) > 0 || len(c.ReaderDeletes) > 0 || len(c.ScheduledUpserts) > 0 || len(c.ScheduledDeletes) > 0
}
