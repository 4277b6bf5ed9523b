package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// MaxHeldStreams bounds the loaded streams, idle ones too, whatever MaxLoadedStreams says: with
// a MaxLoadedStreams above it, a stream loaded while the held ones were all idle pushed the count
// past MaxHeldStreams (the sweep ran only past MaxLoadedStreams), up to MaxLoadedStreams streams
// of 8 descriptors each: itxd's default of 1,024 over a held bound of 256 derived from a small
// open-file limit ran out of descriptors.
func TestServer_HeldStreamsBoundTheIdleOnesToo(t *testing.T) {
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), MaxHeldStreams: 3, MaxLoadedStreams: 1024})
	ctx := context.Background()
	for i := range 12 {
		_, err := s.Append(ctx, StreamRef{ProjectID: projectID, Path: fmt.Sprintf("/s%d", i)}, []itx.EventInput{{Type: "e", Payload: []byte(`{}`)}}, itx.AppendOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return s.LoadedStreams() <= 3 }, 10*time.Second, time.Millisecond,
			"after %d streams, %d are loaded", i+1, s.LoadedStreams())
	}
}
