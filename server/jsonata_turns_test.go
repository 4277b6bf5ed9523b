package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/itx-dev/itx"
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

// A page read as a subscription (getEventPage's subscription) evaluates its filter condition in
// the turn of the stream's project, as the subscription's deliveries do. It waited in a turn of
// no project, shared by every project's such pages: four of one project's pages waiting put
// another project's page behind all four, and one project alone could fill that turn's share of
// the waiting room, so that every other project's pages were refused unavailable.
func TestReadPageAs_ConditionWaitsInItsProjectsTurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, a := mustOpen(t, Config{DataDir: t.TempDir()})
	info, _, _, err := s.CreateProject(ctx, Admin{}, "neighbour")
	require.NoError(t, err)
	b := info.ID
	for _, p := range []string{a, b} {
		ref := StreamRef{ProjectID: p, Path: "/s"}
		_, _, err := s.ConfigureSubscription(ctx, ref, itx.SubscriptionConfig{Name: "w",
			Filter:   &itx.SubscriptionFilter{JSONataCondition: "payload.n > 0"},
			Receiver: itx.Receiver{Action: itx.KindITXCall, Capability: "absent"}}, "")
		require.NoError(t, err)
		_, err = s.Append(ctx, ref, []itx.EventInput{{Type: "x", Payload: []byte(`{"n":1}`)}}, itx.AppendOptions{})
		require.NoError(t, err)
		require.NoError(t, s.Settle(ctx, ref)) // its delivery parked: it evaluates nothing more
	}

	slots := jsonataSlots
	for range slots.size {
		require.NoError(t, slots.acquire("holding"))
	}
	held := slots.size
	defer func() {
		for range held {
			slots.release()
		}
	}()
	waiting := func(project string) int {
		slots.mu.Lock()
		defer slots.mu.Unlock()
		return len(slots.waiters[project])
	}
	read := func(project string, done chan<- error) {
		go func() {
			page, err := s.ReadEvents(ctx, StreamRef{ProjectID: project, Path: "/s"}, itx.Query{Subscription: "w"})
			if err == nil && len(page.Events) != 1 {
				err = fmt.Errorf("project %s: page of %d events, want 1", project, len(page.Events))
			}
			done <- err
		}()
	}
	done := make(chan error, 5)
	for i := range 4 {
		read(a, done)
		require.Eventually(t, func() bool { return jsonataWaiting.Load() == int64(i+1) }, 30*time.Second, time.Millisecond)
	}
	read(b, done)
	require.Eventually(t, func() bool { return jsonataWaiting.Load() == 5 }, 30*time.Second, time.Millisecond)
	require.Equal(t, 4, waiting(a), "project a's pages wait in a's turn")
	require.Equal(t, 1, waiting(b), "project b's page waits in b's turn, one of a's ahead of it, not four")
	for ; held > 0; held-- {
		slots.release()
	}
	for range 5 {
		require.NoError(t, <-done)
	}
}
