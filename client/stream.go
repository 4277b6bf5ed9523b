package client

import (
	"context"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Stream returns project.streams().get(path) as a pipelined capability: no round trip is spent
// until a call on it is awaited. Release it when done.
//
// go-capnp deadlocks if a pipelined accessor is called twice on one unresolved future, so each
// accessor here is called exactly once and its result kept.
func Stream(ctx context.Context, project schema.Project, path string) schema.Stream {
	sf, releaseStreams := project.Streams(ctx, nil)
	streams := sf.Streams()
	gf, releaseGet := streams.Get(ctx, func(p schema.Streams_get_Params) error { return p.SetPath(path) })
	s := gf.Stream().AddRef()
	releaseGet()
	releaseStreams()
	return s
}

// AppendResult answers an append.
type AppendResult struct {
	Offsets    []int64
	Duplicate  []bool
	HeadOffset int64
	StreamID   string
}

// AppendOptions qualify an append; the zero value appends unconditionally.
type AppendOptions struct {
	Conditional        bool
	ExpectedHeadOffset int64
}

// Append appends events atomically and returns once they are durable.
func Append(ctx context.Context, s schema.Stream, events []itx.EventInput, opts AppendOptions) (AppendResult, error) {
	fut, release := s.Append(ctx, func(p schema.Stream_append_Params) error {
		list, err := p.NewEvents(int32(len(events)))
		if err != nil {
			return err
		}
		for i := range events {
			if err := wire.SetEventInput(list.At(i), &events[i]); err != nil {
				return err
			}
		}
		if opts.Conditional {
			o, err := p.NewOptions()
			if err != nil {
				return err
			}
			o.SetConditional(true)
			o.SetExpectedHeadOffset(uint64(opts.ExpectedHeadOffset))
		}
		return nil
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return AppendResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return AppendResult{}, err
	}
	out := AppendResult{HeadOffset: int64(r.HeadOffset())}
	if out.StreamID, err = r.StreamId(); err != nil {
		return out, err
	}
	offsets, err := r.Offsets()
	if err != nil {
		return out, err
	}
	dups, err := r.Duplicate()
	if err != nil {
		return out, err
	}
	for i := 0; i < offsets.Len(); i++ {
		out.Offsets = append(out.Offsets, int64(offsets.At(i)))
		out.Duplicate = append(out.Duplicate, i < dups.Len() && dups.At(i))
	}
	return out, nil
}

// Query selects events for a read.
type Query struct {
	After            int64
	Before           int64
	Limit            int
	Types            []string
	IncludeEphemeral bool
}

func setQuery(q schema.EventQuery, query Query) error {
	q.SetAfter(uint64(query.After))
	q.SetBefore(uint64(query.Before))
	q.SetLimit(uint32(query.Limit))
	q.SetIncludeEphemeral(query.IncludeEphemeral)
	return wire.SetTextList(query.Types, q.NewTypes)
}

// Page is getEventPage's envelope.
type Page struct {
	Events          []itx.Event
	StreamID        string
	StreamMaxOffset int64
	NextAfter       int64
}

// GetEventPage reads one page.
func GetEventPage(ctx context.Context, s schema.Stream, query Query) (Page, error) {
	fut, release := s.GetEventPage(ctx, func(p schema.Stream_getEventPage_Params) error {
		q, err := p.NewQuery()
		if err != nil {
			return err
		}
		return setQuery(q, query)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return Page{}, err
	}
	pg, err := res.Page()
	if err != nil {
		return Page{}, err
	}
	out := Page{StreamMaxOffset: int64(pg.StreamMaxOffset()), NextAfter: int64(pg.NextAfter())}
	if out.StreamID, err = pg.StreamId(); err != nil {
		return out, err
	}
	list, err := pg.Events()
	if err != nil {
		return out, err
	}
	out.Events, err = wire.EventsFromSchema(list)
	return out, err
}

// GetEvents reads one page of events without the envelope.
func GetEvents(ctx context.Context, s schema.Stream, query Query) ([]itx.Event, error) {
	fut, release := s.GetEvents(ctx, func(p schema.Stream_getEvents_Params) error {
		q, err := p.NewQuery()
		if err != nil {
			return err
		}
		return setQuery(q, query)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, err
	}
	list, err := res.Events()
	if err != nil {
		return nil, err
	}
	return wire.EventsFromSchema(list)
}

// ReadAll pages through every event after `after` up to the head at the time of the last page.
func ReadAll(ctx context.Context, s schema.Stream, query Query) ([]itx.Event, error) {
	var all []itx.Event
	for {
		page, err := GetEventPage(ctx, s, query)
		if err != nil {
			return all, err
		}
		all = append(all, page.Events...)
		if page.NextAfter >= page.StreamMaxOffset || page.NextAfter == query.After {
			return all, nil
		}
		query.After = page.NextAfter
	}
}

// Predicate is waitForEvent's match.
type Predicate struct {
	Types            []string
	PayloadContains  string // JSON
	Where            string // JSONata; must be exactly true
	IncludeEphemeral bool
}

// WaitForEvent waits for the first event after `after` matching pred.
func WaitForEvent(ctx context.Context, s schema.Stream, pred Predicate, after int64, timeout time.Duration) (itx.Event, error) {
	fut, release := s.WaitForEvent(ctx, func(p schema.Stream_waitForEvent_Params) error {
		p.SetAfter(uint64(after))
		p.SetTimeoutMs(uint32(timeout.Milliseconds()))
		pr, err := p.NewPredicate()
		if err != nil {
			return err
		}
		pr.SetIncludeEphemeral(pred.IncludeEphemeral)
		if err := pr.SetPayloadContains(pred.PayloadContains); err != nil {
			return err
		}
		if err := pr.SetWhere(pred.Where); err != nil {
			return err
		}
		return wire.SetTextList(pred.Types, pr.NewTypes)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return itx.Event{}, err
	}
	e, err := res.Event()
	if err != nil {
		return itx.Event{}, err
	}
	return wire.EventFromSchema(e)
}

// StreamInfo describes a stream.
type StreamInfo struct {
	Path              string
	StreamID          string
	HeadOffset        int64
	CreatedAt         int64
	LastAppendAt      int64
	SubscriptionCount int
	Loaded            bool
}

func streamInfo(i schema.StreamInfo) StreamInfo {
	path, _ := i.Path()
	id, _ := i.StreamId()
	return StreamInfo{Path: path, StreamID: id, HeadOffset: int64(i.HeadOffset()), CreatedAt: i.CreatedAt(),
		LastAppendAt: i.LastAppendAt(), SubscriptionCount: int(i.SubscriptionCount()), Loaded: i.Loaded()}
}

// Describe describes a stream.
func Describe(ctx context.Context, s schema.Stream) (StreamInfo, error) {
	fut, release := s.Describe(ctx, nil)
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return StreamInfo{}, err
	}
	i, err := res.Info()
	if err != nil {
		return StreamInfo{}, err
	}
	return streamInfo(i), nil
}

// ListStreams lists a project's streams under prefix.
func ListStreams(ctx context.Context, project schema.Project, prefix string) ([]StreamInfo, error) {
	sf, releaseStreams := project.Streams(ctx, nil)
	defer releaseStreams()
	return ListStreamsIn(ctx, sf.Streams(), prefix)
}

// ListStreamsIn lists every stream of a Streams capability already at hand under prefix, page
// by page.
func ListStreamsIn(ctx context.Context, streams schema.Streams, prefix string) ([]StreamInfo, error) {
	var all []StreamInfo
	for after := ""; ; {
		page, next, err := ListStreamsPage(ctx, streams, prefix, after, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		after = next
	}
}

// ListStreamsPage lists one page of streams under prefix, after the path after (exclusive),
// at most limit (0: the server's default). next is where the following page starts, empty on
// the last page.
func ListStreamsPage(ctx context.Context, streams schema.Streams, prefix, after string, limit int) (page []StreamInfo, next string, err error) {
	fut, release := streams.List(ctx, func(p schema.Streams_list_Params) error {
		if err := p.SetPrefix(prefix); err != nil {
			return err
		}
		p.SetLimit(uint32(limit))
		return p.SetAfter(after)
	})
	defer release()
	res, err := fut.Struct()
	if err != nil {
		return nil, "", err
	}
	list, err := res.Streams()
	if err != nil {
		return nil, "", err
	}
	page = make([]StreamInfo, list.Len())
	for i := range page {
		page[i] = streamInfo(list.At(i))
	}
	next, err = res.NextAfter()
	return page, next, err
}
