package server

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// The compiled expressions kept stay within the budget, least recently used out first, and an
// expression dropped is compiled again on its next use and judges as before.
func TestJSONataCache_KeepsWithinTheBudget(t *testing.T) {
	SetJSONataBudget(JSONataBudget{MaxCompiledBytes: 3 * jsonataCompiledCost(len(`payload.n = 0`))})
	t.Cleanup(func() { SetJSONataBudget(JSONataBudget{}) })

	refs := make([]*jsonataRef, 6)
	for i := range refs {
		r, err := newJSONataRef(fmt.Sprintf("payload.n = %d", i), "")
		require.NoError(t, err)
		refs[i] = r
		require.LessOrEqual(t, compiledJSONataBytes(), compiledJSONata.budget)
	}
	for i, r := range refs {
		require.Equal(t, i >= 3, r.expr.Load() != nil, "only the 3 most recently used are kept (%d)", i)
	}
	for i, r := range refs {
		ok, err := r.holds(&itx.Event{Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
		require.NoError(t, err)
		require.True(t, ok, "ref %d judges as compiled at first", i)
		ok, err = r.holds(&itx.Event{Payload: []byte(`{"n":99}`)})
		require.NoError(t, err)
		require.False(t, ok)
		require.LessOrEqual(t, compiledJSONataBytes(), compiledJSONata.budget)
	}

	// Larger than the whole budget: used, not kept.
	big, err := newJSONataRef(`payload.n = 1`+strings.Repeat(" and true", 200), "")
	require.NoError(t, err)
	require.Nil(t, big.expr.Load())
	ok, err := big.holds(&itx.Event{Payload: []byte(`{"n":1}`)})
	require.NoError(t, err)
	require.True(t, ok)
	require.LessOrEqual(t, compiledJSONataBytes(), compiledJSONata.budget)

	// A holder gone gives its room back.
	_, err = refs[5].get()
	require.NoError(t, err)
	require.Equal(t, refs[5].cost, compiledJSONataBytes(), "the big one took every other's room")
	before := compiledJSONataBytes()
	refs[5].release()
	require.Equal(t, before-refs[5].cost, compiledJSONataBytes())
	refs[5].release()
	require.Equal(t, before-refs[5].cost, compiledJSONataBytes(), "released once")
}

// Holders compiling, using and dropping at once (run with -race).
func TestJSONataCache_Concurrent(t *testing.T) {
	SetJSONataBudget(JSONataBudget{MaxCompiledBytes: 4 * jsonataCompiledCost(len(`payload.n = 10`))})
	t.Cleanup(func() { SetJSONataBudget(JSONataBudget{}) })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := newJSONataRef(fmt.Sprintf("payload.n = %d", g), "")
			if !assertNoErr(t, err) {
				return
			}
			for i := range 200 {
				ok, err := r.holds(&itx.Event{Payload: []byte(fmt.Sprintf(`{"n":%d}`, g+i%2))})
				if !assertNoErr(t, err) || ok != (i%2 == 0) {
					t.Errorf("holder %d judged %v at %d", g, ok, i)
					return
				}
			}
			r.release()
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, compiledJSONataBytes(), compiledJSONata.budget)
}

func assertNoErr(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}
