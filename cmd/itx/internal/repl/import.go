package repl

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// Batches of an import: each is one atomic append call, and importInFlight calls are pipelined
// on the stream's capability (they commit in order, sharing group commits).
const (
	importBatchEvents = 100
	importBatchBytes  = 1 << 20
	importInFlight    = 16
	importMaxLine     = itx.MaxEventBytes + 64<<10 // one event at its largest, with its JSON around it
	// importIdleFlush is how long input may pause before what was read is sent as it is.
	importIdleFlush = 200 * time.Millisecond
)

// withControlFlag is the flag of import and export that carries the stream's own stream/*
// control records (subscription-configured, cursor changes, ...) too. They are left out by
// default: replayed into another stream they would configure /a's subscriptions on it.
const withControlFlag = "--with-control"

// takeFlag removes flag from args, reporting whether it was there.
func takeFlag(args []string, flag string) ([]string, bool) {
	out := make([]string, 0, len(args))
	found := false
	for _, a := range args {
		if a == flag {
			found = true
			continue
		}
		out = append(out, a)
	}
	return out, found
}

// runImport appends the events of a newline-delimited JSON file, one EventInput a line (blank
// lines skipped), in order. It stops at the first line that does not parse or the first batch
// itxd refuses, and says how many events went in before it: with idempotency keys, running the
// same import again appends only what is missing. stream/* control records are skipped (and
// counted) unless --with-control is given.
// importArgs are .import's arguments: <path> [file | -] [--with-control].
type importArgs struct {
	path, file  string // file: "" or "-" for standard input
	withControl bool
}

func parseImport(args []string) (importArgs, error) {
	args, withControl := takeFlag(args, withControlFlag)
	if _, err := streamArg("import", args); err != nil {
		return importArgs{}, err
	}
	a := importArgs{path: args[0], withControl: withControl}
	switch {
	case len(args) > 2:
		return a, usageError("import", "too many arguments")
	case len(args) == 2 && args[1] != "-" && strings.HasPrefix(args[1], "-"):
		return a, usageError("import", "unknown flag %q", args[1])
	case len(args) == 2:
		a.file = args[1]
	}
	return a, nil
}

func runImport(ctx context.Context, s *Session, args []string) error {
	ia, err := parseImport(args)
	if err != nil {
		return err
	}
	p, withControl := streamPath(ia.path), ia.withControl
	var in io.Reader
	switch {
	case ia.file != "" && ia.file != "-":
		f, err := os.Open(ia.file)
		if err != nil {
			return itx.Errorf(itx.EInvalid, "import: %v", err)
		}
		defer f.Close()
		in = f
	case s.cfg.In != nil:
		in = s.cfg.In
	default:
		return usageError("import", "name a file to read (standard input is only read by `itx import <path>`)")
	}
	c := s.client(p)
	defer c.Release()
	a := client.NewAppender(schema.Stream(c), importInFlight)

	type sentBatch struct {
		answer      *client.AppendFuture
		first, last int     // its lines
		keyed       []bool  // which of its events carry an idempotency key
		from        []int64 // each event's offset in the stream it was exported from (0: none given)
	}
	var (
		batch             []itx.EventInput
		batchFrom         []int64 // the batch's events' exported offsets (sentBatch.from)
		offsets           offsetMap
		batchBytes        int
		first, last, line int
		sent              []sentBatch
		skipped           int // stream/* lines left out
		platform          int // platform facts left out under --with-control (itx.IsPlatformFact)
		resumes           int // resumes left out under --with-control, with the halts they ended
	)
	// take records the answers at the front of the queue, in order: every one when wait is set,
	// else those already arrived. The queue thus holds only batches in flight (importInFlight at
	// most), however long the file. At the first refusal it waits for the batches sent after it,
	// which may still commit, and names the refused lines.
	var head int64
	// A duplicate is an event already there by its idempotency key, or, for one without a key
	// (a stream/* record), one itxd ignored: an unchanged subscription configure.
	var added, duplicates, ignored int
	count := func(b sentBatch, res itx.AppendResult) {
		for i, at := range res.Offsets {
			if i < len(b.from) && b.from[i] > 0 {
				offsets.add(b.from[i], at)
			}
		}
		for i, dup := range res.Duplicate {
			switch {
			case !dup:
				added++
			case i < len(b.keyed) && b.keyed[i]:
				duplicates++
			default:
				ignored++
			}
		}
		head = max(head, res.HeadOffset)
	}
	total := func() int { return added + duplicates + ignored }
	// unsent names the lines read into the batch not yet sent, which an import stopped before
	// sending it leaves out: whether those before a bad line went in depends on where the
	// batches were cut, so a stop says which did not.
	unsent := func() string {
		switch {
		case len(batch) == 0:
			return ""
		case first == last:
			return fmt.Sprintf("; line %d was read and not sent", first)
		}
		return fmt.Sprintf("; lines %d-%d were read and not sent", first, last)
	}
	// interrupted is the error of an import stopped by Ctrl-C. The answers already in are
	// counted; the batches sent and not yet answered may have committed or not, and nothing
	// says which.
	interrupted := func() error {
	answered:
		for len(sent) > 0 {
			select {
			case <-sent[0].answer.Done():
			default:
				break answered
			}
			res, err := sent[0].answer.Wait(context.Background())
			if err != nil {
				break
			}
			count(sent[0], res)
			sent = sent[1:]
		}
		msg := fmt.Sprintf("import: interrupted; %s imported", plural(total(), "event"))
		if len(sent) > 0 {
			msg += fmt.Sprintf(" before line %d, and lines %d-%d were sent and may have been appended too (with idempotency keys, running it again appends only what is missing)",
				sent[0].first, sent[0].first, sent[len(sent)-1].last)
		}
		msg += unsent()
		sent = nil
		return itx.Errorf(itx.ECancelled, "%s", msg)
	}
	take := func(wait bool) error {
		for len(sent) > 0 {
			b := sent[0]
			if !wait {
				select {
				case <-b.answer.Done():
				default:
					return nil
				}
			}
			res, err := b.answer.Wait(ctx)
			if err != nil && ctx.Err() != nil {
				return interrupted()
			}
			sent = sent[1:]
			if err == nil {
				count(b, res)
				continue
			}
			before := total()
			_ = a.Flush(ctx) // the batches after it: committed or not, each answered
			for _, later := range sent {
				if res, lerr := later.answer.Wait(ctx); lerr == nil {
					count(later, res)
				}
			}
			sent = nil
			return itx.Errorf(itx.ErrorCode(err), "import: lines %d-%d refused (%s); %d events imported before them, %d in the batches already sent after them",
				b.first, b.last, itx.ErrorMessage(err), before, total()-before)
		}
		return nil
	}
	settle := func() error { return take(true) }
	send := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := take(false); err != nil { // a refusal stops the import before the next batch
			return err
		}
		f, err := a.Append(ctx, batch, itx.AppendOptions{})
		if err != nil {
			if ctx.Err() != nil {
				return interrupted()
			}
			return err
		}
		keyed := make([]bool, len(batch))
		for i, e := range batch {
			keyed[i] = e.IdempotencyKey != ""
		}
		sent = append(sent, sentBatch{f, first, last, keyed, batchFrom})
		batch, batchFrom, batchBytes = nil, nil, 0
		return nil
	}

	// Ctrl-C ends a read of standard input that waits for a producer (itx import < fifo), and
	// what was read is sent when the producer pauses, not once 100 lines have come
	// (tail -F log | itx import /logs).
	var idleErr error
	readCtx, stopReading := context.WithCancel(ctx) // its goroutine ends with the import
	defer stopReading()
	sc := bufio.NewScanner(cancelableReader(readCtx, in, func() error {
		idleErr = send()
		return idleErr
	}))
	sc.Buffer(make([]byte, 64<<10), importMaxLine)
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var l struct {
			itx.EventInput
			Offset json.RawMessage `json:"offset"` // an exported event's, in the stream it came from
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			if serr := settle(); serr != nil {
				return serr
			}
			return itx.Errorf(itx.EInvalid, "import: line %d is not an event ({type, payload, ...}): %v; %s before it imported%s", line, err, plural(total(), "event"), unsent())
		}
		e := l.EventInput
		if itx.IsCoreType(e.Type) && !withControl {
			skipped++
			continue
		}
		if itx.IsPlatformFact(e.Type) { // the source's delivery facts (itxd refuses halts and woken records)
			platform++
			continue
		}
		if e.Type == itx.TypeSubscriptionResumed {
			// The halt it ended stayed behind (above), so itxd would refuse it as resuming a
			// subscription that is neither halted nor parked, failing the import there; or,
			// should the copy's own delivery have halted the subscription meanwhile (a
			// processor-wake with no contract of its name), resume what the source never said
			// to. Either way it does not describe the copy.
			resumes++
			continue
		}
		from, _ := strconv.ParseInt(string(l.Offset), 10, 64)
		if from > 0 && refersToOffsets(e) {
			// A cursor-set's afterOffset is an offset of the exported stream, whose events
			// have other offsets here (its ephemeral and trimmed ones left gaps that the copy
			// does not have, and a stream that held events before the import starts further
			// on): it moves the cursor to just after the same event here, the last one
			// imported at or before it. A generated name, subscription:<birth offset>, names
			// the subscription born at that offset, which has another here. That needs the
			// offsets of the events before it, answered.
			if err := send(); err != nil {
				return err
			}
			if err := settle(); err != nil {
				return err
			}
			var terr error
			if e, terr = offsets.translate(e); terr != nil {
				return itx.Errorf(itx.EInvalid, "import: line %d: %v; %s before it imported", line, terr, plural(total(), "event"))
			}
		}
		e.Provenance = nil // only copy-to-stream sets it; an exported copy's hops stay behind
		if len(batch) == 0 {
			first = line
		}
		batch, batchFrom, last = append(batch, e), append(batchFrom, from), line
		batchBytes += len(raw)
		if len(batch) >= importBatchEvents || batchBytes >= importBatchBytes {
			if err := send(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return interrupted()
		}
		if idleErr != nil {
			return idleErr
		}
		if serr := settle(); serr != nil {
			return serr
		}
		if errors.Is(err, bufio.ErrTooLong) {
			return itx.Errorf(itx.ETooLarge, "import: line %d is longer than %s, more than an event can hold (%s); %s before it imported%s",
				line+1, humanBytes(importMaxLine), humanBytes(itx.MaxEventBytes), plural(total(), "event"), unsent())
		}
		return itx.Errorf(itx.EInvalid, "import: after line %d: %v; %s before it imported%s", line, err, plural(total(), "event"), unsent())
	}
	if err := send(); err != nil {
		return err
	}
	if err := settle(); err != nil {
		return err
	}
	fmt.Fprintf(s.cfg.Err, "imported %s into %s (%d new, %d already there by idempotency key", plural(total(), "event"), ia.path, added, duplicates)
	if ignored > 0 {
		fmt.Fprintf(s.cfg.Err, ", %d ignored by itxd as unchanged", ignored)
	}
	fmt.Fprintf(s.cfg.Err, "); head %d\n", head)
	if skipped > 0 {
		fmt.Fprintf(s.cfg.Err, "skipped %s (%s appends them)\n", plural(skipped, "stream/* control record"), withControlFlag)
	}
	if platform > 0 {
		fmt.Fprintf(s.cfg.Err, "skipped %s (halts, woken and revival records: itxd and processor hosts write them)\n", plural(platform, "platform record"))
	}
	if resumes > 0 {
		fmt.Fprintf(s.cfg.Err, "skipped %s (of halts, which are itxd's and stay behind)\n", plural(resumes, "subscription resume"))
	}
	return nil
}

// cancelableReader reads r until ctx ends: a read waiting for input (a pipe whose writer is
// slow or idle) returns ctx's error then, where a read of r itself would wait on. The read in
// progress is left to finish on its own goroutine, into a buffer nothing reads after that.
//
// When a read has waited importIdleFlush for input, idle runs (once per pause): an error it
// returns ends the reading.
func cancelableReader(ctx context.Context, r io.Reader, idle func() error) io.Reader {
	if _, ok := r.(*os.File); !ok {
		return r // what tests and .import hand in answers at once
	}
	c := &chanReader{ctx: ctx, chunks: make(chan readChunk), idle: idle}
	go func() {
		for {
			buf := make([]byte, 64<<10)
			n, err := r.Read(buf)
			select {
			case c.chunks <- readChunk{buf[:n], err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return c
}

// readChunk is one read of cancelableReader's goroutine.
type readChunk struct {
	b   []byte
	err error
}

// chanReader serves the chunks cancelableReader's goroutine reads.
type chanReader struct {
	ctx    context.Context
	chunks chan readChunk
	rest   []byte
	err    error // the last chunk's error, returned once rest is read
	idle   func() error
}

func (c *chanReader) Read(p []byte) (int, error) {
	for len(c.rest) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if c.idle != nil {
			t := time.NewTimer(importIdleFlush)
			select {
			case ch := <-c.chunks:
				t.Stop()
				c.rest, c.err = ch.b, ch.err
				continue
			case <-c.ctx.Done():
				t.Stop()
				return 0, c.ctx.Err()
			case <-t.C:
				if err := c.idle(); err != nil {
					return 0, err
				}
			}
		}
		select {
		case ch := <-c.chunks:
			c.rest, c.err = ch.b, ch.err
		case <-c.ctx.Done():
			return 0, c.ctx.Err()
		}
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

// runExport writes a stream's durable events after an offset (default 0) up to its head when
// the export starts, one JSON event a line, page by page: what `itx import` reads back (which
// keeps type, payload, metadata and idempotency key; the offsets and times are the new stream's).
// The stream's stream/* control records are left out (and counted) unless --with-control is
// given.
// exportArgs are .export's arguments: <path> [after] [--with-control].
type exportArgs struct {
	path        string
	after       int64
	withControl bool
}

func parseExport(args []string) (exportArgs, error) {
	args, withControl := takeFlag(args, withControlFlag)
	if _, err := streamArg("export", args); err != nil {
		return exportArgs{}, err
	}
	e := exportArgs{path: args[0], withControl: withControl}
	switch {
	case len(args) > 2:
		return e, usageError("export", "too many arguments")
	case len(args) == 2 && strings.HasPrefix(args[1], "--"):
		return e, usageError("export", "unknown flag %q", args[1])
	case len(args) == 2:
		after, err := offsetArg("export", args[1])
		if err != nil {
			return e, err
		}
		e.after = after
	}
	return e, nil
}

func runExport(ctx context.Context, s *Session, args []string) error {
	ea, err := parseExport(args)
	if err != nil {
		return err
	}
	after, withControl := ea.after, ea.withControl
	c := s.client(streamPath(ea.path))
	defer c.Release()
	st := schema.Stream(c)
	info, err := client.Describe(ctx, st)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(s.cfg.Out)
	enc := json.NewEncoder(jsonControlWriter{w}) // an exported event may be read on a terminal
	enc.SetEscapeHTML(false)
	n, skipped := 0, 0
	for after < info.HeadOffset {
		page, err := client.GetEventPage(ctx, st, itx.Query{After: after, Before: info.HeadOffset + 1, Limit: 500})
		if err != nil {
			w.Flush()
			return itx.Errorf(itx.ErrorCode(err), "export: after offset %d: %s; %d events written", after, itx.ErrorMessage(err), n)
		}
		if page.StreamID != info.StreamID {
			// Deleted meanwhile (and perhaps created again: another stream, its offsets
			// starting over): its pages are not the rest of the one exported.
			w.Flush()
			now := "no stream is there now"
			if page.StreamID != "" {
				now = "the path holds another stream now (id " + page.StreamID + ")"
			}
			return itx.Errorf(itx.ENotFound, "export: %s (id %s) was deleted while it was exported, after offset %d: %s; %d events written",
				ea.path, info.StreamID, after, now, n)
		}
		for _, e := range eventsJS(page.Events) { // as itx prints events: times in ISO-8601
			if itx.IsCoreType(e.Type) && !withControl {
				skipped++
				continue
			}
			if err := enc.Encode(e); err != nil {
				return err
			}
			n++
		}
		if page.NextAfter <= after {
			break // nothing more to read below the head (ephemeral rows swept)
		}
		after = page.NextAfter
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(s.cfg.Err, "exported %s of %s through offset %d\n", plural(n, "event"), ea.path, info.HeadOffset)
	if skipped > 0 {
		fmt.Fprintf(s.cfg.Err, "skipped %s (%s includes them)\n", plural(skipped, "stream/* control record"), withControlFlag)
	}
	return nil
}

// offsetMap maps the offsets of an exported stream to those its events were imported at here,
// for the cursor-sets an import --with-control replays. It keeps runs of consecutive offsets
// imported at consecutive offsets (an export's gaps, its ephemeral and trimmed events, start a
// new run), at most maxOffsetRuns of them.
type offsetMap struct {
	runs []offsetRun
	full bool // runs reached maxOffsetRuns: later events were not recorded
}

type offsetRun struct{ from, at, n int64 }

// maxOffsetRuns bounds what an import keeps to translate cursor-sets (24 bytes a run).
const maxOffsetRuns = 1 << 20

func (m *offsetMap) add(from, at int64) {
	if k := len(m.runs); k > 0 {
		r := &m.runs[k-1]
		if from == r.from+r.n && at == r.at+r.n {
			r.n++
			return
		}
		if from <= r.from+r.n-1 {
			return // not in the exported order (a line written by hand): not mapped
		}
	}
	if len(m.runs) == maxOffsetRuns {
		m.full = true
		return
	}
	m.runs = append(m.runs, offsetRun{from, at, 1})
}

// generatedName returns the birth offset a generated subscription name (subscription:<offset>)
// carries.
func generatedName(name string) (int64, bool) {
	n, ok := strings.CutPrefix(name, "subscription:")
	if !ok {
		return 0, false
	}
	o, err := strconv.ParseInt(n, 10, 64)
	return o, err == nil && o > 0
}

// refersToOffsets reports whether the stream/* record e holds offsets of the stream it was
// exported from: a cursor-set's afterOffset, or a generated subscription name.
func refersToOffsets(e itx.EventInput) bool {
	if !itx.IsCoreType(e.Type) {
		return false
	}
	if e.Type == itx.TypeSubscriptionCursorSet {
		return true
	}
	var p struct{ Name string }
	if json.Unmarshal(e.Payload, &p) != nil {
		return false
	}
	_, ok := generatedName(strings.TrimSpace(p.Name))
	return ok
}

// translate returns the stream/* record e with the offsets of the exported stream it holds
// made offsets here: a cursor-set's afterOffset becomes the offset here of the last event
// imported at or before it (after the same events; before every imported event, 0 among them,
// the offset just before the first one imported), and a generated name subscription:<offset>
// names the offset its birth event was imported at (left as it is when that event was not).
func (m *offsetMap) translate(e itx.EventInput) (itx.EventInput, error) {
	var payload map[string]json.RawMessage // keep every field the line had
	if err := json.Unmarshal(e.Payload, &payload); err != nil || len(m.runs) == 0 {
		return e, nil // as it is: itxd says what is wrong with it, or nothing was imported to map it to
	}
	if m.full {
		return e, fmt.Errorf("a record naming offsets after %d runs of offsets, more than an import maps", maxOffsetRuns)
	}
	var name string
	if json.Unmarshal(payload["name"], &name) == nil {
		if born, ok := generatedName(strings.TrimSpace(name)); ok {
			if at, ok := m.exact(born); ok {
				payload["name"], _ = json.Marshal(fmt.Sprintf("subscription:%d", at))
			}
		}
	}
	var after int64
	if e.Type == itx.TypeSubscriptionCursorSet && json.Unmarshal(payload["afterOffset"], &after) == nil {
		i := m.before(after)
		switch {
		case i < 0:
			after = m.runs[0].at - 1
		case after < m.runs[i].from+m.runs[i].n:
			after = m.runs[i].at + (after - m.runs[i].from)
		default:
			after = m.runs[i].at + m.runs[i].n - 1
		}
		payload["afterOffset"] = json.RawMessage(strconv.FormatInt(after, 10))
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return e, err
	}
	e.Payload = raw
	return e, nil
}

// before returns the index of the last run starting at or before from, -1 if none does.
func (m *offsetMap) before(from int64) int {
	return sort.Search(len(m.runs), func(i int) bool { return m.runs[i].from > from }) - 1
}

// exact returns the offset here of the event imported from offset from, if one was.
func (m *offsetMap) exact(from int64) (int64, bool) {
	i := m.before(from)
	if i < 0 || from >= m.runs[i].from+m.runs[i].n {
		return 0, false
	}
	return m.runs[i].at + (from - m.runs[i].from), true
}
