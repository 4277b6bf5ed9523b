package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// standingCollector reports where every stream's consumers stand, computed at each scrape: the
// directory's summaries for the streams not loaded, the live state of the loaded ones (the
// figures Streams.list shows per stream, summed up for an alert).
type standingCollector struct {
	s                             *Server
	subs, halted, maxLag, readers *prometheus.Desc
}

func newStandingCollector(s *Server) *standingCollector {
	return &standingCollector{
		s: s,
		subs: prometheus.NewDesc("itx_subscriptions",
			"Subscriptions on all streams.", nil, nil),
		halted: prometheus.NewDesc("itx_subscriptions_halted",
			"Subscriptions halted now, on all streams (delivery stopped until resumed): alert on any.", nil, nil),
		maxLag: prometheus.NewDesc("itx_consumer_lag_max_events",
			"The largest lag (head offset - confirmed offset or checkpoint) of any subscription or registered reader.", nil, nil),
		readers: prometheus.NewDesc("itx_readers",
			"Registered readers (Stream.readers) on all streams.", nil, nil),
	}
}

func (c *standingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.subs
	ch <- c.halted
	ch <- c.maxLag
	ch <- c.readers
}

func (c *standingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.s.consumerStanding(ctx)
	if err != nil {
		for _, d := range []*prometheus.Desc{c.subs, c.halted, c.maxLag, c.readers} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.subs, prometheus.GaugeValue, float64(st.subscriptions))
	ch <- prometheus.MustNewConstMetric(c.halted, prometheus.GaugeValue, float64(st.halted))
	ch <- prometheus.MustNewConstMetric(c.maxLag, prometheus.GaugeValue, float64(st.maxLag))
	ch <- prometheus.MustNewConstMetric(c.readers, prometheus.GaugeValue, float64(st.readers))
}

type consumerStanding struct {
	subscriptions, halted, readers int
	maxLag                         int64
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
		out.subscriptions += e.SubscriptionCount
		out.halted += e.HaltedSubscriptions
		out.maxLag = max(out.maxLag, e.MaxLag)
		out.readers += e.ReaderCount
	}
	for _, a := range loaded {
		v := a.view()
		var subs map[string]*catalogEntry
		if v.core != nil {
			subs = v.core.Subscriptions
		}
		halted, lag := standing(v.head, subs, valueRow(v.rows), v.readers)
		out.subscriptions += len(subs)
		out.halted += halted
		out.maxLag = max(out.maxLag, lag)
		out.readers += len(v.readers)
	}
	return out, nil
}
