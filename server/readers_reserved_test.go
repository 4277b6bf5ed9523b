package server

import (
	"testing"
	"time"

	"github.com/itx-dev/itx/storage"
	"github.com/stretchr/testify/require"
)

// A reader registered under the generated-name prefix before that prefix was reserved (be1bb0c)
// still moves its checkpoint: the reservation refuses new names only, so an upgrade does not
// strand a consumer's reader. A new name in the prefix is still refused.
func TestApplyReader_ReservedPrefixRefusesOnlyNewNames(t *testing.T) {
	st := newStreamState(nil)
	st.created, st.born, st.head = true, true, 10
	st.readers["subscription:legacy"] = storage.Reader{Name: "subscription:legacy", Checkpoint: 2}
	now := time.Unix(1_700_000_000, 0)
	var eff effects
	require.NoError(t, st.applyReader(readerOp{name: "subscription:legacy", checkpoint: 5}, now, reduceContext{}, &eff))
	require.Equal(t, int64(5), st.readers["subscription:legacy"].Checkpoint)
	require.Error(t, st.applyReader(readerOp{name: "subscription:new", checkpoint: 5}, now, reduceContext{}, &eff))
}
