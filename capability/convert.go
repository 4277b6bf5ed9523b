package capability

import (
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

func readQuery(q schema.EventQuery) (server.ReadQuery, error) {
	types, err := wire.TextList(q.Types())
	if err != nil {
		return server.ReadQuery{}, err
	}
	after, err := itx.ValidateOffset("query.after", q.After())
	if err != nil {
		return server.ReadQuery{}, err
	}
	before, err := itx.ValidateOffset("query.before", q.Before())
	if err != nil {
		return server.ReadQuery{}, err
	}
	return server.ReadQuery{
		After: after, Before: before, Limit: int(q.Limit()),
		Types: types, IncludeEphemeral: q.IncludeEphemeral(),
	}, nil
}

func setStreamInfo(dst schema.StreamInfo, info server.StreamInfo) error {
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
	dst.SetLoaded(info.Loaded)
	return nil
}
