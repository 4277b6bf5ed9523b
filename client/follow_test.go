package client

import (
	"context"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// TestFollow_RefusesWhatNoReconnectionMends: a config Follow could only retry forever (an empty
// or portless address) or that itxd would refuse on every connection (a bad path) is refused
// before any dial, invalidArgument, with After as the last offset.
func TestFollow_RefusesWhatNoReconnectionMends(t *testing.T) {
	ok := FollowConfig{Addr: "127.0.0.1:1", Token: "t", Path: "/a", Connection: ConnectionOptions{After: 7}}
	for name, mend := range map[string]func(*FollowConfig){
		"empty addr":       func(c *FollowConfig) { c.Addr = "" },
		"no port":          func(c *FollowConfig) { c.Addr = "localhost" },
		"empty port":       func(c *FollowConfig) { c.Addr = "localhost:" },
		"empty path":       func(c *FollowConfig) { c.Path = "" },
		"relative path":    func(c *FollowConfig) { c.Path = "a/b" },
		"resume no reader": func(c *FollowConfig) { c.Resume = true },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ok
			mend(&cfg)
			delivered := false
			last, err := Follow(context.Background(), cfg, func(context.Context, itx.DeliveryBatch) error {
				delivered = true
				return nil
			})
			require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
			require.Equal(t, int64(7), last)
			require.False(t, delivered)
		})
	}
	// The valid config passes the check (it would dial).
	require.NoError(t, ok.check())
}
