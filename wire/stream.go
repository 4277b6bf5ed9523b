package wire

import (
	"encoding/json"
	"math"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// SetAppendOptions encodes append options.
func SetAppendOptions(dst schema.AppendOptions, o itx.AppendOptions) {
	dst.SetConditional(o.Conditional)
	dst.SetExpectedHeadOffset(uint64(o.ExpectedHeadOffset))
}

// AppendOptionsFromSchema decodes append options.
func AppendOptionsFromSchema(src schema.AppendOptions) itx.AppendOptions {
	return itx.AppendOptions{Conditional: src.Conditional(), ExpectedHeadOffset: int64(src.ExpectedHeadOffset())}
}

// SetAppendResult encodes an append's answer.
func SetAppendResult(dst schema.AppendResult, r itx.AppendResult) error {
	dst.SetHeadOffset(uint64(r.HeadOffset))
	if err := dst.SetStreamId(r.StreamID); err != nil {
		return err
	}
	offsets, err := dst.NewOffsets(int32(len(r.Offsets)))
	if err != nil {
		return err
	}
	dups, err := dst.NewDuplicate(int32(len(r.Duplicate)))
	if err != nil {
		return err
	}
	for i, o := range r.Offsets {
		offsets.Set(i, uint64(o))
		dups.Set(i, r.Duplicate[i])
	}
	return nil
}

// AppendResultFromSchema decodes an append's answer.
func AppendResultFromSchema(src schema.AppendResult) (itx.AppendResult, error) {
	out := itx.AppendResult{HeadOffset: int64(src.HeadOffset())}
	var err error
	if out.StreamID, err = src.StreamId(); err != nil {
		return out, err
	}
	offsets, err := src.Offsets()
	if err != nil {
		return out, err
	}
	dups, err := src.Duplicate()
	if err != nil {
		return out, err
	}
	for i := 0; i < offsets.Len(); i++ {
		out.Offsets = append(out.Offsets, int64(offsets.At(i)))
		out.Duplicate = append(out.Duplicate, i < dups.Len() && dups.At(i))
	}
	return out, nil
}

// SetQuery encodes a read query.
func SetQuery(dst schema.EventQuery, q itx.Query) error {
	dst.SetAfter(uint64(q.After))
	dst.SetBefore(uint64(q.Before))
	dst.SetLimit(uint32(min(max(q.Limit, 0), math.MaxUint32))) // past 32 bits: a full page, not a wrapped limit
	dst.SetIncludeEphemeral(q.IncludeEphemeral)
	if q.Subscription != "" {
		if err := dst.SetSubscription(q.Subscription); err != nil {
			return err
		}
	}
	return SetTextList(q.Types, dst.NewTypes)
}

// QueryFromSchema decodes a read query.
func QueryFromSchema(src schema.EventQuery) (itx.Query, error) {
	types, err := TextList(src.Types())
	if err != nil {
		return itx.Query{}, err
	}
	after, err := itx.ValidateOffset("query.after", src.After())
	if err != nil {
		return itx.Query{}, err
	}
	before, err := itx.ValidateOffset("query.before", src.Before())
	if err != nil {
		return itx.Query{}, err
	}
	sub, err := src.Subscription()
	if err != nil {
		return itx.Query{}, err
	}
	return itx.Query{
		After: after, Before: before, Limit: int(src.Limit()),
		Types: types, IncludeEphemeral: src.IncludeEphemeral(), Subscription: sub,
	}, nil
}

// SetPage encodes a page of events with its envelope.
func SetPage(dst schema.EventPage, p itx.Page) error {
	dst.SetStreamMaxOffset(uint64(p.StreamMaxOffset))
	dst.SetNextAfter(uint64(p.NextAfter))
	if err := dst.SetStreamId(p.StreamID); err != nil {
		return err
	}
	return SetEvents(p.Events, dst.NewEvents)
}

// PageFromSchema decodes a page of events with its envelope.
func PageFromSchema(src schema.EventPage) (itx.Page, error) {
	out := itx.Page{StreamMaxOffset: int64(src.StreamMaxOffset()), NextAfter: int64(src.NextAfter())}
	var err error
	if out.StreamID, err = src.StreamId(); err != nil {
		return out, err
	}
	out.Events, err = eventList(src.Events())
	return out, err
}

// SetPredicate encodes waitForEvent's predicate.
func SetPredicate(dst schema.EventPredicate, p itx.Predicate) error {
	dst.SetIncludeEphemeral(p.IncludeEphemeral)
	if err := dst.SetPayloadContains(string(p.PayloadContains)); err != nil {
		return err
	}
	if err := dst.SetWhere(p.Where); err != nil {
		return err
	}
	return SetTextList(p.Types, dst.NewTypes)
}

// PredicateFromSchema decodes waitForEvent's predicate.
func PredicateFromSchema(src schema.EventPredicate) (itx.Predicate, error) {
	out := itx.Predicate{IncludeEphemeral: src.IncludeEphemeral()}
	var err error
	if out.Types, err = TextList(src.Types()); err != nil {
		return out, err
	}
	contains, err := src.PayloadContains()
	if err != nil {
		return out, err
	}
	out.PayloadContains = json.RawMessage(contains)
	out.Where, err = src.Where()
	return out, err
}

// SetStreamInfo encodes a stream's description.
func SetStreamInfo(dst schema.StreamInfo, info itx.StreamInfo) error {
	if err := dst.SetPath(info.Path); err != nil {
		return err
	}
	if err := dst.SetStreamId(info.StreamID); err != nil {
		return err
	}
	dst.SetHeadOffset(uint64(info.HeadOffset))
	dst.SetCreatedAt(info.CreatedAt)
	dst.SetLastAppendAt(info.LastAppendAt)
	dst.SetSubscriptionCount(uint32(info.SubscriptionCount))
	dst.SetHaltedSubscriptions(uint32(info.HaltedSubscriptions))
	dst.SetMaxLag(uint64(info.MaxLag))
	dst.SetReaderCount(uint32(info.Readers))
	dst.SetParkedSubscriptions(uint32(info.ParkedSubscriptions))
	dst.SetTrimmedThrough(uint64(info.TrimmedThrough))
	dst.SetRetentionMaxAgeMs(info.RetentionMaxAgeMs)
	dst.SetRetentionMaxEvents(uint64(info.RetentionMaxEvents))
	dst.SetLoaded(info.Loaded)
	dst.SetRetentionMaxBytes(uint64(info.RetentionMaxBytes))
	return dst.SetUnavailable(info.Unavailable)
}

// StreamInfoFromSchema decodes a stream's description.
func StreamInfoFromSchema(src schema.StreamInfo) (itx.StreamInfo, error) {
	out := itx.StreamInfo{HeadOffset: int64(src.HeadOffset()), CreatedAt: src.CreatedAt(),
		LastAppendAt: src.LastAppendAt(), SubscriptionCount: int(src.SubscriptionCount()), Loaded: src.Loaded(),
		HaltedSubscriptions: int(src.HaltedSubscriptions()), MaxLag: int64(src.MaxLag()), Readers: int(src.ReaderCount()),
		ParkedSubscriptions: int(src.ParkedSubscriptions()), TrimmedThrough: int64(src.TrimmedThrough()),
		RetentionMaxAgeMs: src.RetentionMaxAgeMs(), RetentionMaxEvents: int64(src.RetentionMaxEvents()),
		RetentionMaxBytes: int64(src.RetentionMaxBytes())}
	var err error
	if out.Path, err = src.Path(); err != nil {
		return out, err
	}
	if out.StreamID, err = src.StreamId(); err != nil {
		return out, err
	}
	out.Unavailable, err = src.Unavailable()
	return out, err
}

// SetMountInfos encodes mounts into a new list made by newList.
func SetMountInfos(mounts []itx.MountInfo, newList func(int32) (schema.MountInfo_List, error)) error {
	list, err := newList(int32(len(mounts)))
	if err != nil {
		return err
	}
	for i, m := range mounts {
		list.At(i).SetMountedAt(m.MountedAt)
		if err := list.At(i).SetName(m.Name); err != nil {
			return err
		}
		if m.Scope != "" {
			if err := list.At(i).SetScope(m.Scope); err != nil {
				return err
			}
		}
		if len(m.Contracts) > 0 {
			cl, err := list.At(i).NewContracts(int32(len(m.Contracts)))
			if err != nil {
				return err
			}
			if err := SetProcessorContracts(cl, m.Contracts); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetProcessorContracts encodes a processor host's announced contracts.
func SetProcessorContracts(list schema.ProcessorContract_List, contracts []itx.ProcessorInfo) error {
	for i, c := range contracts {
		dst := list.At(i)
		if err := dst.SetName(c.Name); err != nil {
			return err
		}
		if err := dst.SetReducerVersion(c.ReducerVersion); err != nil {
			return err
		}
		if len(c.InitialState) > 0 {
			if err := dst.SetInitialState(string(c.InitialState)); err != nil {
				return err
			}
		}
		types, err := dst.NewConsumedTypes(int32(len(c.ConsumedTypes)))
		if err != nil {
			return err
		}
		for j, t := range c.ConsumedTypes {
			if err := types.Set(j, t); err != nil {
				return err
			}
		}
	}
	return nil
}

// ProcessorContractsFromSchema decodes announced contracts.
func ProcessorContractsFromSchema(list schema.ProcessorContract_List) ([]itx.ProcessorInfo, error) {
	out := make([]itx.ProcessorInfo, list.Len())
	for i := range out {
		c := list.At(i)
		var err error
		if out[i].Name, err = c.Name(); err != nil {
			return nil, err
		}
		if out[i].ReducerVersion, err = c.ReducerVersion(); err != nil {
			return nil, err
		}
		if init, err := c.InitialState(); err != nil {
			return nil, err
		} else if init != "" {
			out[i].InitialState = json.RawMessage(init)
		}
		types, err := c.ConsumedTypes()
		if err != nil {
			return nil, err
		}
		for j := 0; j < types.Len(); j++ {
			t, err := types.At(j)
			if err != nil {
				return nil, err
			}
			out[i].ConsumedTypes = append(out[i].ConsumedTypes, t)
		}
	}
	return out, nil
}

// MountInfosFromSchema decodes a list of mounts.
func MountInfosFromSchema(list schema.MountInfo_List) ([]itx.MountInfo, error) {
	out := make([]itx.MountInfo, list.Len())
	for i := range out {
		m := list.At(i)
		out[i].MountedAt = m.MountedAt()
		var err error
		if out[i].Name, err = m.Name(); err != nil {
			return nil, err
		}
		if out[i].Scope, err = m.Scope(); err != nil {
			return nil, err
		}
		if m.HasContracts() {
			cl, err := m.Contracts()
			if err != nil {
				return nil, err
			}
			if out[i].Contracts, err = ProcessorContractsFromSchema(cl); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// SetProjectInfo encodes a project's description.
func SetProjectInfo(dst schema.ProjectInfo, p itx.ProjectInfo) error {
	dst.SetDeployment(p.Deployment)
	if err := dst.SetId(p.ID); err != nil {
		return err
	}
	return dst.SetName(p.Name)
}

// ProjectInfoFromSchema decodes a project's description.
func ProjectInfoFromSchema(src schema.ProjectInfo) (itx.ProjectInfo, error) {
	out := itx.ProjectInfo{Deployment: src.Deployment()}
	var err error
	if out.ID, err = src.Id(); err != nil {
		return out, err
	}
	out.Name, err = src.Name()
	return out, err
}

// SetReaderInfos encodes readers into a new list made by newList.
func SetReaderInfos(readers []itx.ReaderInfo, newList func(int32) (schema.ReaderInfo_List, error)) error {
	list, err := newList(int32(len(readers)))
	if err != nil {
		return err
	}
	for i, r := range readers {
		d := list.At(i)
		d.SetCheckpoint(uint64(r.Checkpoint))
		d.SetLag(uint64(r.Lag))
		d.SetUpdatedAt(r.UpdatedAt)
		if err := d.SetName(r.Name); err != nil {
			return err
		}
	}
	return nil
}

// ReaderInfosFromSchema decodes a list of readers.
func ReaderInfosFromSchema(list schema.ReaderInfo_List) ([]itx.ReaderInfo, error) {
	out := make([]itx.ReaderInfo, list.Len())
	for i := range out {
		r := list.At(i)
		out[i] = itx.ReaderInfo{Checkpoint: int64(r.Checkpoint()), Lag: int64(r.Lag()), UpdatedAt: r.UpdatedAt()}
		var err error
		if out[i].Name, err = r.Name(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SetStreamDiskUsage encodes one row of Streams.diskUsage.
func SetStreamDiskUsage(dst schema.StreamDiskUsage, u itx.StreamDiskUsage) error {
	if err := dst.SetPath(u.Path); err != nil {
		return err
	}
	if err := dst.SetStreamId(u.StreamID); err != nil {
		return err
	}
	dst.SetDiskBytes(uint64(u.DiskBytes))
	dst.SetHeadOffset(uint64(u.HeadOffset))
	return nil
}

// StreamDiskUsageFromSchema decodes one row of Streams.diskUsage.
func StreamDiskUsageFromSchema(src schema.StreamDiskUsage) (itx.StreamDiskUsage, error) {
	path, err := src.Path()
	if err != nil {
		return itx.StreamDiskUsage{}, err
	}
	id, err := src.StreamId()
	if err != nil {
		return itx.StreamDiskUsage{}, err
	}
	return itx.StreamDiskUsage{Path: path, StreamID: id, DiskBytes: int64(src.DiskBytes()), HeadOffset: int64(src.HeadOffset())}, nil
}
