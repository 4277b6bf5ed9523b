package server

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fence of a processor's forwards: a key it took from an event above the processor's cursor
// is a duplicate though a trim took it; another key, one from an event at or below the cursor, or
// one of another stream at the source path, is not; a key goes once a later forward says the
// cursor passed its event; at most maxFencedEffects are kept, the lowest events' going first.
func TestEffectFence_KeysAboveTheCursor(t *testing.T) {
	st := newCoreState()
	stamp := func(offset, processed int64) *effectStamp {
		return &effectStamp{SourcePath: "/rt", Name: "router", StreamID: "s1", Offset: offset, Processed: processed}
	}
	require.False(t, st.effectTaken(stamp(5, 4), "k5"))
	require.True(t, st.effectsChange(stamp(5, 4), []string{"k5"}))
	st.acceptEffects(stamp(5, 4), []string{"k5"}, 1)
	require.True(t, st.effectTaken(stamp(5, 4), "k5"), "made again after a crash")
	require.False(t, st.effectTaken(stamp(6, 4), "k6"), "another forward")
	other := stamp(5, 4)
	other.StreamID = "s2"
	require.False(t, st.effectTaken(other, "k5"), "another stream at the path: its own forwards")

	c := st.clone()
	c.acceptEffects(stamp(9, 8), []string{"k9"}, 2)
	require.Equal(t, map[string]int64{"k5": 5}, st.Effects["/rt"]["router"].Keys, "a clone does not share the record")
	require.False(t, c.effectTaken(stamp(9, 8), "k5"), "the cursor passed its event: never made again")
	require.True(t, c.effectTaken(stamp(9, 8), "k9"))
	require.False(t, c.effectsChange(stamp(9, 8), nil), "nothing to keep, nothing to drop")

	for i := range maxFencedEffects + 10 {
		c.acceptEffects(stamp(int64(10+i), 8), []string{fmt.Sprintf("n%d", i)}, 3)
	}
	keys := c.Effects["/rt"]["router"].Keys
	require.Len(t, keys, maxFencedEffects)
	require.NotContains(t, keys, "k9", "the lowest event's key went first")
	require.Contains(t, keys, fmt.Sprintf("n%d", maxFencedEffects+9))
}

// evictLeastRecent (inbound records, effect fences) keeps the bound's most recently used
// records, the oldest going first and ties by path and name, and drops a path left empty.
func TestEvictLeastRecent_KeepsTheMostRecent(t *testing.T) {
	m := map[string]map[string]*effectFence{
		"/a": {"x": {LastAt: 5}, "y": {LastAt: 1}},
		"/b": {"x": {LastAt: 1}},
		"/c": {"z": {LastAt: 9}},
	}
	at := func(r *effectFence) int64 { return r.LastAt }
	evictLeastRecent(m, 4, at)
	require.Len(t, m, 3, "within the bound nothing goes")
	evictLeastRecent(m, 2, at)
	require.Equal(t, map[string]map[string]*effectFence{"/a": {"x": {LastAt: 5}}, "/c": {"z": {LastAt: 9}}}, m,
		"the two used at 1 went (/a y and /b x), and /b with its last record")
	evictLeastRecent(m, 1, at)
	require.Equal(t, map[string]map[string]*effectFence{"/c": {"z": {LastAt: 9}}}, m)
}
