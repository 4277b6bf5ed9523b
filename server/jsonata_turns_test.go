package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Evaluations waiting for a JSONata slot take the slots freed in turns by project: a project
// with many waiting does not put another project's one behind all of its own, and past its own
// share of the waiting room only its evaluations are refused.
func TestJSONataTurns_ByProject(t *testing.T) {
	q := newJSONataTurns(1)
	require.NoError(t, q.acquire("a"))
	waiting := func(project string) int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.waiters[project])
	}
	got := make(chan string, 8)
	queue := func(project string, n int) {
		before := waiting(project)
		for i := range n {
			go func() {
				require.NoError(t, q.acquire(project))
				got <- project
			}()
			require.Eventually(t, func() bool { return waiting(project) == before+i+1 }, 10*time.Second, time.Millisecond)
		}
	}
	queue("a", 4)
	queue("b", 1)
	var order []string
	for range 5 {
		q.release()
		order = append(order, <-got)
	}
	require.Equal(t, []string{"a", "b", "a", "a", "a"}, order, "b's evaluation waited one of a's, not all four")
	q.release()
	require.Equal(t, 1, q.free)

	// The waiting room: a project past its share is refused, another still waits its turn.
	require.NoError(t, q.acquire("a"))
	release := make(chan struct{})
	done := make(chan string, maxJSONataWaitingPerProject+1)
	for range maxJSONataWaitingPerProject {
		go func() {
			require.NoError(t, q.acquire("a"))
			<-release
			done <- "a"
			q.release()
		}()
	}
	require.Eventually(t, func() bool { return waiting("a") == maxJSONataWaitingPerProject }, 10*time.Second, time.Millisecond)
	refused := make(chan error, 1)
	go func() { refused <- q.acquire("a") }()
	select {
	case err := <-refused:
		require.ErrorIs(t, err, errJSONataBusy)
	case <-time.After(10 * time.Second):
		t.Fatal("a project past its share of the waiting room waits on")
	}
	go func() {
		require.NoError(t, q.acquire("b"))
		done <- "b"
		q.release()
	}()
	require.Eventually(t, func() bool { return waiting("b") == 1 }, 10*time.Second, time.Millisecond)
	q.release()
	close(release)
	order = order[:0]
	for range maxJSONataWaitingPerProject + 1 {
		order = append(order, <-done)
	}
	require.Equal(t, []string{"a", "b"}, order[:2], "b, refused nothing, waited one turn of a's")
	require.Eventually(t, func() bool { // the last evaluation gives its slot back after saying done
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.free == 1 && len(q.order) == 0
	}, 10*time.Second, time.Millisecond)
}
