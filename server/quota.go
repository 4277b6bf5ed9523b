package server

import (
	"context"
	"sync"

	"github.com/itx-dev/itx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// The project storage quota (Config.MaxProjectBytes): while a project's streams take that much
// disk (their files, as describe's diskBytes and itx du count them), appends that add events to
// them are refused with resourceExhausted, writing nothing, as below the disk reserve. One
// tenant filling the disk would otherwise refuse every other's appends.

// usageStatBytes is how many bytes a stream commits between two readings of its files' size:
// a project may pass its quota by about that much per stream appending at once, besides the
// last append (at most itx.MaxAppendBytes).
const usageStatBytes = 256 << 10

// projectUsage is the disk a project's streams take: per stream the size of its files when last
// read, and their sum.
type projectUsage struct {
	id    string
	ready chan struct{} // closed once the first reading is done (err says how it went)
	err   error

	log zerolog.Logger // says when the project goes over its quota, and back under

	mu      sync.Mutex
	streams map[string]int64 // stream ID -> bytes
	total   int64
	over    bool // the last room answer refused: logged once per crossing
}

// usageBook holds the projects' usage, read from the files when first needed (a project's first
// stream load in this process), then kept by its streams' actors as they commit, give space back
// and unload, and by the removal of their files.
type usageBook struct {
	mu       sync.Mutex
	projects map[string]*projectUsage
	byStream map[string]*projectUsage
}

// usage is projectID's usage, read from its streams' files first if this process has not yet
// (nil when the quota is off). ctx bounds only this caller's wait for a reading another runs.
func (s *Server) usage(ctx context.Context, projectID string) (*projectUsage, error) {
	if s.cfg.MaxProjectBytes <= 0 {
		return nil, nil
	}
	b := &s.quota
	b.mu.Lock()
	if b.projects == nil {
		b.projects, b.byStream = map[string]*projectUsage{}, map[string]*projectUsage{}
	}
	u := b.projects[projectID]
	first := u == nil
	if first {
		u = &projectUsage{id: projectID, ready: make(chan struct{}), streams: map[string]int64{}, log: s.log}
		b.projects[projectID] = u
	}
	b.mu.Unlock()
	if first {
		u.err = s.readUsage(context.WithoutCancel(ctx), u)
		if u.err != nil {
			b.mu.Lock()
			delete(b.projects, projectID) // read again by the next caller
			b.mu.Unlock()
		}
		close(u.ready)
	}
	select {
	case <-u.ready:
		return u, u.err
	case <-ctx.Done():
		return nil, itx.Errorf(itx.ECancelled, "project usage: %v", ctx.Err())
	}
}

// readUsage reads the size of every stream of the project from its files.
func (s *Server) readUsage(ctx context.Context, u *projectUsage) error {
	after := ""
	for {
		page, err := s.dir.ListStreamsUnder(ctx, u.id, "", "", after, MaxListStreams)
		if err != nil {
			return itx.Errorf(itx.EUnavailable, "project usage: %v", err)
		}
		for _, e := range page {
			u.set(&s.quota, e.StreamID, s.backend.DiskBytes(e.StreamID))
		}
		if len(page) < MaxListStreams {
			return nil
		}
		after = page[len(page)-1].Path
	}
}

// set records a stream's size (0: it has no files, none yet or no more).
func (u *projectUsage) set(b *usageBook, streamID string, bytes int64) {
	if bytes == 0 {
		b.forget([]string{streamID})
		return
	}
	u.mu.Lock()
	u.total += bytes - u.streams[streamID]
	u.streams[streamID] = bytes
	u.mu.Unlock()
	b.mu.Lock()
	b.byStream[streamID] = u
	b.mu.Unlock()
}

// forget drops streams whose files are gone from their projects' usage.
func (b *usageBook) forget(streamIDs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range streamIDs {
		u := b.byStream[id]
		if u == nil {
			continue
		}
		delete(b.byStream, id)
		u.mu.Lock()
		u.total -= u.streams[id]
		delete(u.streams, id)
		u.mu.Unlock()
	}
}

// room is nil while the project's streams take less than the quota, else the error an append
// that adds events is refused with.
func (u *projectUsage) room(quota int64) error {
	if u == nil || quota <= 0 {
		return nil
	}
	u.mu.Lock()
	total, was := u.total, u.over
	u.over = total >= quota
	u.mu.Unlock()
	if total < quota {
		if was {
			u.log.Info().Str("project", u.id).Int64("bytes", total).Int64("quota", quota).Msg("the project's streams are under its quota again: appends are taken")
		}
		return nil
	}
	if !was {
		// An operator sees the crossing (a disk reserve's is logged alike); every refused
		// append after it says so to its caller.
		u.log.Warn().Str("project", u.id).Int64("bytes", total).Int64("quota", quota).
			Msg("the project's streams reached its quota (--max-project-bytes): appends that add events are refused until it trims or deletes streams")
	}
	return itx.Errorf(itx.EResourceExhausted,
		"the project's streams take %d bytes on disk, its quota is %d (--max-project-bytes): nothing was written; appends are refused until the project trims or deletes streams (itx du shows where the space goes)",
		total, quota)
}

// noteSize reads the stream's files' size into its project's usage: after usageStatBytes
// committed since the last reading, or at once (force: it gave space back, or unloads).
// Actor goroutine only.
func (a *actor) noteSize(committed int64, force bool) {
	if a.usage == nil || a.st.streamID == "" {
		return
	}
	a.sinceStat += committed
	if !force && a.sinceStat < usageStatBytes {
		return
	}
	a.sinceStat = 0
	a.usage.set(&a.srv.quota, a.st.streamID, a.srv.backend.DiskBytes(a.st.streamID))
}

// quotaCollector shows the project quota on /metrics: the quota, and per project the disk its
// streams take as itxd counts it against the quota (what refuses its appends past it). Only with
// a quota (itxd reads the usage only then), and only the projects whose streams this process
// has loaded since it started (each project's files are measured at its first stream's load):
// one series per project with streams on disk, so as many as the deployment root made projects.
type quotaCollector struct {
	s            *Server
	quota, bytes *prometheus.Desc
}

func newQuotaCollector(s *Server) *quotaCollector {
	return &quotaCollector{s: s,
		quota: prometheus.NewDesc("itx_project_quota_bytes",
			"Disk one project's streams may take (--max-project-bytes; 0: no quota).", nil, nil),
		bytes: prometheus.NewDesc("itx_project_disk_bytes",
			"Disk a project's streams take, as counted against --max-project-bytes (read when its first stream loads, then kept as its streams commit): alert as it nears itx_project_quota_bytes. Only with a quota, for projects whose streams this process has loaded.", []string{"project"}, nil),
	}
}

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.quota
	ch <- c.bytes
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(max(c.s.cfg.MaxProjectBytes, 0)))
	b := &c.s.quota
	b.mu.Lock()
	projects := make([]*projectUsage, 0, len(b.projects))
	for _, u := range b.projects {
		projects = append(projects, u)
	}
	b.mu.Unlock()
	for _, u := range projects {
		select {
		case <-u.ready:
		default:
			continue // being read
		}
		if u.err != nil {
			continue
		}
		u.mu.Lock()
		total, n := u.total, len(u.streams)
		u.mu.Unlock()
		if n == 0 {
			continue // no stream on disk any more (deleted, or the project with them)
		}
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(total), u.id)
	}
}
