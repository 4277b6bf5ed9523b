package server

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The dead-letter fence of an offset-acking subscription: a letter below one it took is not a
// duplicate (the subscription sends again from its confirmed cursor, so it may letter an event
// its receiver took, then refused), a letter it took is one though a trim took its key, and what
// is at or below a confirmed cursor a letter was stamped with is settled.
func TestInbound_AckingLettersFencedByOffset(t *testing.T) {
	st := newCoreState()
	stamp := func(confirmed int64) *copyStamp {
		return &copyStamp{SourcePath: "/src", Name: "mailer", StreamID: "s1", CursorChangedAtOffset: 3, Acking: true, Confirmed: confirmed}
	}
	require.False(t, st.tookAlready(stamp(4), 9))
	require.NoError(t, st.acceptCopy(stamp(4), 1, []int64{9}, 1))
	require.True(t, st.tookAlready(stamp(4), 9), "its letter, taken")
	require.False(t, st.tookAlready(stamp(4), 7), "below a letter taken, not taken itself")
	require.NoError(t, st.acceptCopy(stamp(4), 1, []int64{7}, 2))
	require.True(t, st.tookAlready(stamp(4), 7))
	require.NoError(t, st.acceptCopy(stamp(8), 1, []int64{12}, 3))
	require.True(t, st.tookAlready(stamp(8), 5), "at or below a confirmed cursor: never lettered again")
	require.Equal(t, []int64{9, 12}, st.Inbound["/src"]["mailer"].Lettered, "those under the cursor are dropped")
	other := stamp(8)
	other.CursorChangedAtOffset = 10
	require.False(t, st.tookAlready(other, 9), "another seek epoch: its own letters")
	c := st.clone()
	c.Inbound["/src"]["mailer"].Lettered[0] = 99
	require.Equal(t, []int64{9, 12}, st.Inbound["/src"]["mailer"].Lettered, "a clone does not share them")

	// Not offset-acking: the highest offset taken.
	plain := &copyStamp{SourcePath: "/src", Name: "copier", StreamID: "s1"}
	require.NoError(t, st.acceptCopy(plain, 2, []int64{4, 6}, 4))
	require.True(t, st.tookAlready(plain, 5))
	require.False(t, st.tookAlready(plain, 7))
}
