package server

import "sync"

// jsonataTurns admits at most a fixed number of JSONata evaluations at once (one per core by
// default), so the memory all evaluations hold is bounded by that many budgets. Evaluations past
// it wait, and take the slots freed in turns by project: one of each project waiting, then
// again. A channel queued them first come first served, so a project whose subscriptions
// evaluated heavy expressions over many events put every other project's evaluations behind
// all of its own; and past maxJSONataWaiting waiters an evaluation is refused outright (an
// outage to a delivery, which backs off), which one project alone could bring on every other.
// A project may now keep at most maxJSONataWaitingPerProject waiting: past it only its own are
// refused, and the others always find room.
type jsonataTurns struct {
	size    int
	mu      sync.Mutex
	free    int
	waiters map[string][]chan struct{} // by project, oldest first
	order   []string                   // projects with waiters: the next slot freed goes to the first
}

const maxJSONataWaitingPerProject = maxJSONataWaiting - maxJSONataWaiting/4

func newJSONataTurns(n int) *jsonataTurns {
	return &jsonataTurns{size: n, free: n, waiters: map[string][]chan struct{}{}}
}

// acquire takes a slot for an evaluation of project's, waiting its project's turn, or fails
// with errJSONataBusy when too many wait (over all projects, or of its own).
func (q *jsonataTurns) acquire(project string) error {
	q.mu.Lock()
	if q.free > 0 && len(q.order) == 0 {
		q.free--
		q.mu.Unlock()
		return nil
	}
	mine := q.waiters[project]
	if jsonataWaiting.Load() >= maxJSONataWaiting || len(mine) >= maxJSONataWaitingPerProject {
		q.mu.Unlock()
		return errJSONataBusy
	}
	turn := make(chan struct{})
	if len(mine) == 0 {
		q.order = append(q.order, project)
	}
	q.waiters[project] = append(mine, turn)
	jsonataWaiting.Add(1)
	q.mu.Unlock()
	<-turn // evaluations end within their time limit: a turn always comes
	return nil
}

// release gives the slot to the first project in turn, which goes to the back of the turns if
// more of its evaluations wait.
func (q *jsonataTurns) release() {
	q.mu.Lock()
	if len(q.order) == 0 {
		q.free++
		q.mu.Unlock()
		return
	}
	project := q.order[0]
	q.order = q.order[1:]
	w := q.waiters[project]
	turn := w[0]
	if len(w) == 1 {
		delete(q.waiters, project)
	} else {
		q.waiters[project] = w[1:]
		q.order = append(q.order, project)
	}
	jsonataWaiting.Add(-1)
	q.mu.Unlock()
	close(turn)
}
