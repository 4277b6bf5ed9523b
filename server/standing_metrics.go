package server

import (
	"context"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
	"github.com/prometheus/client_golang/prometheus"
)

// standingCollector reports where every stream's consumers stand, computed at each scrape: the
// directory's summaries for the streams not loaded, the live state of the loaded ones (the
// figures Streams.list shows per stream, summed up for an alert).
type standingCollector struct {
	s                                     *Server
	subs, halted, parked, maxLag, readers *prometheus.Desc
}

func newStandingCollector(s *Server) *standingCollector {
	return &standingCollector{
		s: s,
		subs: prometheus.NewDesc("itx_subscriptions",
			"Subscriptions on all streams.", nil, nil),
		halted: prometheus.NewDesc("itx_subscriptions_halted",
			"Subscriptions halted now, on all streams (delivery stopped until resumed): alert on any.", nil, nil),
		parked: prometheus.NewDesc("itx_subscriptions_parked",
			"Subscriptions parked now, on all streams: their receiver (a remote processor's host, a mounted capability) is absent; delivery resumes when it returns.", nil, nil),
		maxLag: prometheus.NewDesc("itx_consumer_lag_max_events",
			"The largest lag (head offset - confirmed offset or checkpoint) of any subscription or registered reader.", nil, nil),
		readers: prometheus.NewDesc("itx_readers",
			"Registered readers (Stream.readers) on all streams.", nil, nil),
	}
}

func (c *standingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.subs
	ch <- c.halted
	ch <- c.parked
	ch <- c.maxLag
	ch <- c.readers
}

func (c *standingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.s.consumerStanding(ctx)
	if err != nil {
		for _, d := range []*prometheus.Desc{c.subs, c.halted, c.parked, c.maxLag, c.readers} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.subs, prometheus.GaugeValue, float64(st.subscriptions))
	ch <- prometheus.MustNewConstMetric(c.halted, prometheus.GaugeValue, float64(st.halted))
	ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(st.parked))
	ch <- prometheus.MustNewConstMetric(c.maxLag, prometheus.GaugeValue, float64(st.maxLag))
	ch <- prometheus.MustNewConstMetric(c.readers, prometheus.GaugeValue, float64(st.readers))
}

type consumerStanding struct {
	subscriptions, halted, parked, readers int
	maxLag                                 int64
}

// add sums o into st: counts add up, the lag is the larger.
func (st *consumerStanding) add(o consumerStanding) {
	st.subscriptions += o.subscriptions
	st.halted += o.halted
	st.parked += o.parked
	st.readers += o.readers
	st.maxLag = max(st.maxLag, o.maxLag)
}

// summaryStanding is where a stream's consumers stood at its directory summary's last refresh.
func summaryStanding(e *storage.StreamEntry) consumerStanding {
	return consumerStanding{subscriptions: e.SubscriptionCount, halted: e.HaltedSubscriptions,
		parked: e.ParkedSubscriptions, readers: e.ReaderCount, maxLag: e.MaxLag}
}

// setIn puts the standing into a stream's listing.
func (st consumerStanding) setIn(info *itx.StreamInfo) {
	info.SubscriptionCount, info.HaltedSubscriptions, info.ParkedSubscriptions = st.subscriptions, st.halted, st.parked
	info.MaxLag, info.Readers = st.maxLag, st.readers
}

// consumerStanding sums where the consumers of all streams stand.
func (s *Server) consumerStanding(ctx context.Context) (consumerStanding, error) {
	var out consumerStanding
	// A stream being unloaded writes its summary on the way out: until then its actor's view is
	// the newer one. A loading one (not ready) counts as its summary says.
	s.mu.Lock()
	loaded := make(map[StreamRef]*actor, len(s.actors)+len(s.unloading))
	for _, m := range []map[StreamRef]*actor{s.unloading, s.actors} {
		for ref, a := range m {
			if isClosed(a.ready) && a.loadErr == nil {
				loaded[ref] = a
			}
		}
	}
	s.mu.Unlock()
	// The directory is read after the actors are taken: an unload finishing in between has
	// written its summary by then (the other way round, its stream would count as it stood
	// before its load).
	entries, err := s.dir.ConsumerStandings(ctx)
	if err != nil {
		return out, err
	}
	for _, e := range entries {
		if loaded[StreamRef{e.ProjectID, e.Path}] != nil {
			continue // its live state below is newer than its summary
		}
		out.add(summaryStanding(&e))
	}
	for _, a := range loaded {
		v := a.view()
		var subs map[string]*catalogEntry
		if v.core != nil {
			subs = v.core.Subscriptions
		}
		out.add(standing(v.head, subs, valueRow(v.rows), v.readers))
	}
	return out, nil
}
