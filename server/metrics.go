package server

import (
	"github.com/itx-dev/itx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the server's Prometheus instruments, on a registry of their own so that several
// servers (tests) can live in one process.
type Metrics struct {
	Registry *prometheus.Registry

	AppendCalls     *prometheus.CounterVec // by result code ("ok" or an itx code)
	AppendedEvents  prometheus.Counter
	AppendedBytes   prometheus.Counter
	AppendLatency   prometheus.Histogram // queue + commit + fsync, per call
	CommitLatency   prometheus.Histogram // one group commit, fsync included
	CommitEvents    prometheus.Histogram // events per group commit
	CommitCalls     prometheus.Histogram // append calls sharing one group commit
	ReadEvents      prometheus.Counter
	FullDiskReads   prometheus.Counter // reads served from a stream's database file alone (disk full)
	LoadedStreams   prometheus.Gauge
	RPCConnections  prometheus.Gauge
	RPCAcceptErrors prometheus.Counter // accepts refused by the system (out of file descriptors), retried

	DeliveryFailures *prometheus.CounterVec // failed push attempts by receiver kind
	LateAcks         prometheus.Counter     // acks refused by an epoch fence
	CommitFailures   *prometheus.CounterVec // stream commits refused by storage, by code
	// The ladder's loud outcomes, counted once committed: what an operator alerts on.
	SubscriptionHalts prometheus.Counter     // subscriptions halted (delivery stops until resumed)
	SkippedEvents     prometheus.Counter     // failing events skipped under onFailingEvent: skip
	SubscriptionParks prometheus.Counter     // subscriptions parked (their receiver is absent)
	HandlerPanics     *prometheus.CounterVec // RPC handlers that panicked, by method

	OpenConnections  prometheus.Gauge   // stream connections open
	Sessions         prometheus.Gauge   // logins held by open RPC connections
	WebhooksInFlight prometheus.Gauge   // webhook requests open
	ConnectionEvents prometheus.Counter // events sent to connections
	ConnectionDirect prometheus.Counter // batches the actor sent itself (pushDirect)
	LiveSubscribers  prometheus.Gauge   // live-state subscribers attached
	// ShareHits counts, by project and flag, the times a project found its share of a global
	// bound full (shares.go): who is crowding the others.
	ShareHits *prometheus.CounterVec
	// AtShare is 1, by project and flag, while a project stands at its share of a global bound
	// (from a refusal or wait at it until it holds half its share or less, as the logs say):
	// ShareHits says how often, this says who is there now.
	AtShare *prometheus.GaugeVec

	// Backups: an operator alerts on the age of the last one written.
	Backups          *prometheus.CounterVec // by result code ("ok" or an itx code)
	BackupLastOK     prometheus.Gauge       // unix seconds of the instant the last backup written holds
	BackupLastFrozen prometheus.Gauge       // seconds the loaded streams stood still for it

	DiskFree    prometheus.Gauge // the data directory's free bytes at the reserve's last reading
	DiskReserve prometheus.Gauge // Config.MinFreeDisk

	StreamsDeleted prometheus.Counter // Streams.remove
	TrimmedEvents  prometheus.Counter // events Stream.trim deleted
	VacuumedBytes  prometheus.Counter // free space given back to the file system (stream_trim.go)
}

// NewHandlerPanics is the counter of RPC handlers that panicked (answered internal), by method.
func NewHandlerPanics() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "itx_rpc_handler_panics_total", Help: "RPC handlers that panicked and answered internal, by method.",
	}, []string{"method"})
}

func newMetrics() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		AppendCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "itx_append_calls_total", Help: "Append calls by result.",
		}, []string{"result"}),
		AppendedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_appended_events_total", Help: "Events committed (duplicates excluded).",
		}),
		AppendedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_appended_bytes_total", Help: "Bytes of type, payload, metadata and key committed.",
		}),
		AppendLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "itx_append_latency_seconds", Help: "Append call latency from queueing to durable commit.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}),
		CommitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "itx_commit_latency_seconds", Help: "Group commit latency including fsync.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}),
		CommitEvents: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "itx_commit_events", Help: "Events per group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 15),
		}),
		CommitCalls: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "itx_commit_calls", Help: "Append calls sharing one group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		ReadEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_read_events_total", Help: "Events returned by range reads.",
		}),
		FullDiskReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_full_disk_reads_total", Help: "Reads (and describes) of a stream that could not be loaded on a full disk, served from its database file alone.",
		}),
		LoadedStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_loaded_streams", Help: "Stream actors currently loaded.",
		}),
		RPCConnections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_rpc_connections", Help: "Open Cap'n Proto RPC connections.",
		}),
		RPCAcceptErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_rpc_accept_errors_total", Help: "Accepts of an RPC connection the system refused for want of a resource (file descriptors: EMFILE, ENFILE), each retried after a pause.",
		}),
		DeliveryFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "itx_delivery_failures_total", Help: "Failed subscription delivery attempts by receiver kind.",
		}, []string{"kind"}),
		CommitFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "itx_commit_failures_total", Help: "Stream commits that failed (nothing of them written; the stream's state reloaded from storage), by code: resourceExhausted is a full disk.",
		}, []string{"code"}),
		LateAcks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_late_acks_total", Help: "Delivery acknowledgements refused because the subscription's epoch moved.",
		}),
		SubscriptionHalts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_subscription_halts_total", Help: "Subscriptions halted by the retry ladder (delivery stops until resumeSubscription).",
		}),
		SkippedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_subscription_skipped_events_total", Help: "Failing events skipped by subscriptions whose policy is skip.",
		}),
		SubscriptionParks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_subscription_parks_total", Help: "Subscriptions parked because their receiver is absent (resumed when it returns).",
		}),
		HandlerPanics: NewHandlerPanics(),
		OpenConnections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_open_connections", Help: "Stream connections open.",
		}),
		WebhooksInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_webhooks_in_flight", Help: "Webhook requests open (at most --webhook-max-in-flight).",
		}),
		Sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_sessions", Help: "Logins held by open RPC connections (a login again with the same token on a connection shares one).",
		}),
		ConnectionEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_connection_events_total", Help: "Events sent to stream connections.",
		}),
		ConnectionDirect: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_connection_direct_batches_total", Help: "Batches sent to connections at the tail by the stream's writer right after the commit, not through the connection's reader.",
		}),
		ShareHits: newShareHits(),
		AtShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "itx_project_at_share", Help: "1 while a project stands at its share of a bound shared by every project, by project and flag: from a refusal or wait at the share (itx_project_share_full_total) until it holds half its share or less. Absent otherwise.",
		}, []string{"project", "flag"}),
		LiveSubscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_live_subscribers", Help: "Live-state subscribers attached.",
		}),
		Backups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "itx_backups_total", Help: "Backups (Admin.backup) by result.",
		}, []string{"result"}),
		BackupLastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_backup_last_success_timestamp_seconds", Help: "The instant the last backup written holds (unix seconds): by this process, or at start with --backup-dir the newest scheduled one there (from its name: when it started); 0: none yet.",
		}),
		BackupLastFrozen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_backup_last_frozen_seconds", Help: "How long the loaded streams stood still for the last backup written.",
		}),
		TrimmedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_trimmed_events_total", Help: "Events Stream.trim deleted (retention).",
		}),
		DiskFree: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_disk_free_bytes", Help: "Free bytes on the data directory's file system, read at each scrape (at most every 250ms).",
		}),
		DiskReserve: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "itx_disk_reserve_bytes", Help: "Bytes kept free on the data directory's file system (--min-free-disk-bytes): below it appends are refused with resourceExhausted.",
		}),
		VacuumedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_vacuumed_bytes_total", Help: "Bytes of streams' files that trims, sweeps and deletes freed and that went back to the file system.",
		}),
		StreamsDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "itx_streams_deleted_total", Help: "Streams deleted one by one (Streams.remove; not those deleted with their project).",
		}),
	}
	r.MustRegister(m.DeliveryFailures, m.CommitFailures, m.LateAcks, m.SubscriptionHalts, m.SkippedEvents, m.SubscriptionParks, m.HandlerPanics, m.AppendCalls, m.AppendedEvents, m.AppendedBytes, m.AppendLatency, m.CommitLatency,
		m.CommitEvents, m.CommitCalls, m.ReadEvents, m.FullDiskReads, m.LoadedStreams, m.RPCConnections, m.RPCAcceptErrors,
		m.OpenConnections, m.Sessions, m.WebhooksInFlight, m.ConnectionEvents, m.ConnectionDirect, m.LiveSubscribers, m.ShareHits, m.AtShare,
		m.Backups, m.BackupLastOK, m.BackupLastFrozen, m.StreamsDeleted, m.TrimmedEvents, m.DiskReserve, m.VacuumedBytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "itx_jsonata_compiled_bytes", Help: "Estimated bytes of the compiled JSONata expressions kept in memory (bounded by --jsonata-max-compiled-bytes; process-wide).",
		}, func() float64 { return float64(compiledJSONataBytes()) }))
	// Every receiver kind's failure count exists from the start, at 0, so an alert on its rate
	// sees 0 rather than no data until the first failure.
	for _, kind := range []string{itx.KindWebhookPost, itx.KindCopyToStream, itx.KindITXCall, itx.KindProcessorWake} {
		m.DeliveryFailures.WithLabelValues(kind)
	}
	m.Backups.WithLabelValues("ok")
	// The codes a disk refuses commits with, at 0 from the start, for the same reason: an alert
	// on rate(itx_commit_failures_total{code="resourceExhausted"}) saw no data until the disk
	// first filled, indistinguishable from a scrape that fails.
	for _, code := range []itx.Code{itx.EResourceExhausted, itx.EUnavailable} {
		m.CommitFailures.WithLabelValues(string(code))
	}
	m.AppendCalls.WithLabelValues("ok")
	return m
}

// refreshedCollector collects c after refresh: a gauge whose value is read when scraped.
type refreshedCollector struct {
	refresh func()
	prometheus.Collector
}

func (c refreshedCollector) Collect(ch chan<- prometheus.Metric) {
	c.refresh()
	c.Collector.Collect(ch)
}
