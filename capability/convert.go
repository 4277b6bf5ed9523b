package capability

import (
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

func readQuery(q schema.EventQuery) (server.ReadQuery, error) {
	types, err := wire.TextList(q.Types())
	if err != nil {
		return server.ReadQuery{}, err
	}
	return server.ReadQuery{
		After: int64(q.After()), Before: int64(q.Before()), Limit: int(q.Limit()),
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
