package server

import (
	"sync"
	"sync/atomic"

	"github.com/itx-dev/itx"
	"github.com/prometheus/client_golang/prometheus"
)

// Some bounds are global: the webhook requests in flight, the streams held loaded, the live
// connections and views, the RPC connections. A project at its own per-connection and per-project bounds could take
// all of one (many streams, many logins), and every other project would then wait or be
// refused. Each project may take at most its share of such a bound (by default three quarters
// of it), so whatever one project does, the others keep the rest.
//
// The flags that name the shares, as an operator reads them in logs, errors and metrics.
const (
	flagWebhookShare = "--webhook-max-in-flight-per-project"
	flagHeldShare    = "--max-held-streams-per-project"
	flagLiveShare    = "--max-live-per-project"
	flagConnShare    = "--rpc-max-connections-per-project"
)

// DefaultShare is a project's share of a global bound when its flag is left at 0: three
// quarters of it (at least 1), leaving a quarter to the other projects.
func DefaultShare(global int) int { return max(1, global-global/4) }

// projectShares counts what each project holds of the shared bounds. Its maps hold one entry
// per project that holds something now (and a webhook semaphore per project that delivered to
// a webhook, one channel each: the projects are bounded by the directory).
type projectShares struct {
	mu       sync.Mutex
	live     map[string]int
	conns    map[string]int // RPC connections logged in to the project
	webhooks map[string]chan struct{}
	full     map[shareKey]bool // the project stood at its share when last seen: logged once per crossing
	anyFull  atomic.Int32      // len(full): releases skip the lock while no project is at a share
}

type shareKey struct{ project, flag string }

func newProjectShares() *projectShares {
	return &projectShares{live: map[string]int{}, conns: map[string]int{}, webhooks: map[string]chan struct{}{}, full: map[shareKey]bool{}}
}

// webhookSlots is the project's semaphore of webhook requests in flight (its share of
// MaxWebhooksInFlight).
func (s *Server) webhookSlots(project string) chan struct{} {
	sh := s.shares
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.webhooks[project]
	if c == nil {
		c = make(chan struct{}, s.cfg.MaxWebhooksInFlightPerProject)
		sh.webhooks[project] = c
	}
	return c
}

// takeLiveShare counts one live connection or view of project, refused with ELimitExceeded past
// MaxLivePerProject.
func (s *Server) takeLiveShare(project string) error {
	if n, ok := s.shares.take(s.shares.live, project, s.cfg.MaxLivePerProject); !ok {
		s.shareFull(project, flagLiveShare, n)
		return itx.Errorf(itx.ELimitExceeded, "a project holds at most %d live connections and live-state views open (%s): close some first", s.cfg.MaxLivePerProject, flagLiveShare)
	}
	return nil
}

func (s *Server) releaseLiveShare(project string) {
	if n := s.shares.give(s.shares.live, project); n <= s.cfg.MaxLivePerProject/2 { // well under it: a project at its share is not logged at every close and open
		s.shareFree(project, flagLiveShare)
	}
}

// TakeConnectionShare counts one more RPC connection logged in to project, refused with
// ELimitExceeded past Config.MaxRPCConnectionsPerProject. The capability layer calls it at a
// connection's first login to the project, and ReleaseConnectionShare once the connection ends.
func (s *Server) TakeConnectionShare(project string) error {
	if n, ok := s.shares.take(s.shares.conns, project, s.cfg.MaxRPCConnectionsPerProject); !ok {
		s.shareFull(project, flagConnShare, n)
		return itx.Errorf(itx.ELimitExceeded, "the project has %d RPC connections logged in, its share of --rpc-max-connections (%s): log in on one of them (a connection serves many calls and streams), or close some first", n, flagConnShare)
	}
	return nil
}

// ReleaseConnectionShare gives back a connection counted by TakeConnectionShare.
func (s *Server) ReleaseConnectionShare(project string) {
	if n := s.shares.give(s.shares.conns, project); n <= s.cfg.MaxRPCConnectionsPerProject/2 {
		s.shareFree(project, flagConnShare)
	}
}

// take counts one more of project in counts (live or conns) unless it holds limit already;
// n is what it held.
func (sh *projectShares) take(counts map[string]int, project string, limit int) (n int, ok bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if n = counts[project]; n >= limit {
		return n, false
	}
	counts[project] = n + 1
	return n, true
}

// give counts one fewer of project in counts, forgetting a project that holds none, and says
// how many it holds now.
func (sh *projectShares) give(counts map[string]int, project string) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if counts[project] <= 1 {
		delete(counts, project)
		return 0
	}
	counts[project]--
	return counts[project]
}

// shareFull tells the operator which project stands at its share of a global bound: a counter
// per project and flag on every refusal or wait, and a warning once per crossing.
func (s *Server) shareFull(project, flag string, held int) {
	s.metrics.ShareHits.WithLabelValues(project, flag).Inc()
	sh := s.shares
	k := shareKey{project, flag}
	sh.mu.Lock()
	was := sh.full[k]
	sh.full[k] = true
	sh.anyFull.Store(int32(len(sh.full)))
	if !was {
		s.metrics.AtShare.WithLabelValues(project, flag).Set(1) // under the lock: in step with full
	}
	sh.mu.Unlock()
	if !was {
		s.log.Warn().Str("project", project).Str("flag", flag).Int("held", held).
			Msg("the project holds its whole share of a bound shared by every project (" + flag + "): its calls past it are refused, or its deliveries wait, while other projects go on")
	}
}

// shareFree forgets that project stood at its share of flag (logged once it had). Callers call
// it once the project holds half its share or less, so one hovering at its share is logged once.
func (s *Server) shareFree(project, flag string) {
	sh := s.shares
	if sh.anyFull.Load() == 0 {
		return
	}
	k := shareKey{project, flag}
	sh.mu.Lock()
	was := sh.full[k]
	delete(sh.full, k)
	sh.anyFull.Store(int32(len(sh.full)))
	if was {
		s.metrics.AtShare.DeleteLabelValues(project, flag)
	}
	sh.mu.Unlock()
	if was {
		s.log.Info().Str("project", project).Str("flag", flag).Msg("the project is under its share of a shared bound again (" + flag + ")")
	}
}

// forgetProjectShares drops what the shares keep of a deleted project: its webhook semaphore,
// its crossings, its series of itx_project_share_full_total and itx_project_at_share, and its
// streams waiting for its share of the held streams. Kept, they grew by one per
// project ever deleted. A delivery still in flight holds its own reference to the semaphore.
func (s *Server) forgetProjectShares(project string) {
	sh := s.shares
	sh.mu.Lock()
	delete(sh.webhooks, project)
	for k := range sh.full {
		if k.project == project {
			delete(sh.full, k)
		}
	}
	sh.anyFull.Store(int32(len(sh.full)))
	s.metrics.AtShare.DeletePartialMatch(prometheus.Labels{"project": project})
	sh.mu.Unlock()
	s.metrics.ShareHits.DeletePartialMatch(prometheus.Labels{"project": project})
	s.mu.Lock()
	delete(s.heldWaiting, project)
	s.mu.Unlock()
}

func newShareHits() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "itx_project_share_full_total",
		Help: "Times a project found its share of a bound shared by every project full, by project and flag: a live connection or view, a stream load (a delivery's too) or a login of one more RPC connection refused; a webhook delivery made to wait for the project's own requests.",
	}, []string{"project", "flag"})
}
