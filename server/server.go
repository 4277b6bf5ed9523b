// Package server runs streams: one actor goroutine per loaded stream owns its SQLite database,
// group-commits appends, and serves reads and barriers beside it. It knows nothing of RPC; the
// capability package exposes it as the Cap'n Proto graph.
package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/flowconn"
	"github.com/itx-dev/itx/storage"
	"github.com/rs/zerolog"
)

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	DataDir string
	Clock   itx.Clock // default: the system clock
	Log     zerolog.Logger

	IdleTimeout      time.Duration // unload an unused stream after this; default itx.IdleActorTeardown
	MaxLoadedStreams int           // unload least recently used idle streams above this; default 1024, at most MaxHeldStreams
	// Scheduled backups (backup_schedule.go): every BackupEvery (0: none) a backup is written
	// under BackupDir (absolute, existing, outside the data directory), and all but the newest
	// BackupKeep of them (default DefaultBackupKeep, at most MaxBackupKeep) are deleted.
	BackupDir   string
	BackupEvery time.Duration
	BackupKeep  int
	// MaxHeldStreams bounds the streams loaded at once, idle or not: a call (or a connection, a
	// live-state handle, a delivery) that needs one more while that many are loaded and none is
	// idle fails with limitExceeded. Each costs goroutines and SQLite file descriptors, so itxd
	// derives its default from the open-file limit; default here 4,096.
	MaxHeldStreams int
	// MaxHeldStreamsPerProject bounds the streams of one project held in use at once (by calls,
	// connections, live-state handles, deliveries): past it a call of that project needing one
	// more fails with limitExceeded, so one project cannot hold every stream MaxHeldStreams
	// allows. Default DefaultShare(MaxHeldStreams).
	MaxHeldStreamsPerProject int

	BreakerBurst           int // default itx.BreakerBurst
	BreakerRefillPerMinute int // default itx.BreakerRefillPerMinute

	// EphemeralRetention is how long ephemeral rows stay readable before a sweep may delete them.
	EphemeralRetention time.Duration // default 1 h
	// EphemeralBufferBytes bounds the ephemeral rows one stream holds (type, payload and
	// metadata bytes); past it the oldest go first, whatever their age.
	EphemeralBufferBytes int64 // default itx.EphemeralBufferBytes (10 MiB)

	MaxSubscriptions int // per stream; default itx.MaxSubscriptionsPerStream
	// MaxSubscriptionConfigBytes bounds one subscription's config (the configured event's
	// payload); default itx.MaxSubscriptionConfigBytes.
	MaxSubscriptionConfigBytes int
	// MaxReadersPerStream bounds the registered readers of one stream; default 1,024.
	MaxReadersPerStream int
	// MaxScheduledPerStream bounds the pending scheduled appends of one stream; default 10,000.
	MaxScheduledPerStream int
	// MaxProcessorKVKeys and MaxProcessorKVBytes bound the processors' KV of one stream (in-process
	// and remote processors together): its keys, and the bytes of its keys and values; defaults
	// DefaultMaxProcessorKVKeys and DefaultMaxProcessorKVBytes.
	MaxProcessorKVKeys  int
	MaxProcessorKVBytes int64
	DeliveryTimeout     time.Duration // per push attempt; default itx.DeliveryTimeout
	// CursorFlushDelay bounds how long delivery progress may sit in memory before it is written
	// when no append carries it; a crash inside it only causes redelivery. Default 200 ms.
	CursorFlushDelay time.Duration
	Egress           EgressPolicy // webhook destinations
	// MaxConnectionsPerStream bounds the open connections of one stream; default 16,384.
	MaxConnectionsPerStream int
	// MaxLiveSubscribersPerStream bounds the live-state subscribers of one stream (connections'
	// state frames aside, bounded by the connection cap); default 1,024.
	MaxLiveSubscribersPerStream int
	// MaxLivePerSession bounds the live connections and live-state views one login holds open,
	// on any streams (each holds goroutines and buffers while it lasts); default 4,096.
	MaxLivePerSession int
	// MaxLive bounds the live connections and live-state views open at once over every login:
	// the per-login bound alone let a client grow itxd by logins (one per RPC connection)
	// times it; default 65,536.
	MaxLive int
	// MaxLivePerProject bounds the live connections and live-state views one project's logins
	// hold open at once, so one project on many logins cannot take all of MaxLive. Default
	// DefaultShare(MaxLive).
	MaxLivePerProject int
	// MaxRPCConnectionsPerProject bounds the RPC connections logged in to one project at once
	// (a connection logged in to two projects counts for each), its share of itxd's
	// --rpc-max-connections, so one project's token holders cannot take every connection and
	// leave the other projects' clients refused at accept. Default
	// DefaultShare(flowconn.DefaultConnections); itxd passes the share of its flag.
	MaxRPCConnectionsPerProject int
	// MaxMountsPerProject bounds the capabilities mounted under names in one project, and
	// separately the processor hosts mounted in it (a name already mounted can be replaced);
	// default 4,096.
	MaxMountsPerProject int
	// MaxHostContractBytes bounds the contracts one processor host announces (names, reducer
	// versions, consumed types), kept for its mount's life; default DefaultMaxHostContractBytes.
	MaxHostContractBytes int
	// MaxSecretsPerProject bounds the distinct webhook secrets one project keeps; default
	// itx.MaxSecretsPerProject.
	MaxSecretsPerProject int
	// MaxStreamsPerProject bounds the streams one project holds (each its own database file and
	// directory entry): the append that would create one more fails with limitExceeded and
	// writes nothing. Default itx.MaxStreamsPerProject.
	MaxStreamsPerProject int
	// MaxTokensPerProject bounds the tokens one project holds; creating one more fails with
	// limitExceeded and writes nothing. Default itx.MaxTokensPerProject.
	MaxTokensPerProject int
	// MaxWebhooksInFlight bounds the webhook requests itxd has open at once, over every
	// subscription (each holds a socket); a delivery waits for a slot before its delivery
	// timeout starts (waiting holds no socket). Default 1,024.
	MaxWebhooksInFlight int
	// MaxWebhooksInFlightPerProject bounds the webhook requests one project's subscriptions have
	// open at once (a delivery waits for one of the project's slots, then for one of the
	// server's), so receivers of one project that hang until the timeout cannot hold every slot
	// of MaxWebhooksInFlight. Default DefaultShare(MaxWebhooksInFlight).
	MaxWebhooksInFlightPerProject int
	// MaxWebhookResponseHeaderBytes bounds the header of a webhook's answer (status line and
	// header fields) that itxd reads; a longer one fails the delivery as an outage. Without it
	// net/http read up to 10 MiB of each (tens of MiB of memory once parsed) for every request
	// in flight. Default DefaultMaxWebhookResponseHeaderBytes.
	MaxWebhookResponseHeaderBytes int64
	// MinFreeDisk is the space kept free on the file system holding the data directory: while
	// less is free, appends that add events are refused with resourceExhausted (diskreserve.go).
	// 0: none; negative: DefaultMinFreeDisk.
	MinFreeDisk int64
	// MaxProjectBytes is the disk one project's streams may take (their files, as diskBytes
	// counts them); past it appends that add events to them are refused with resourceExhausted
	// (quota.go). 0: none.
	MaxProjectBytes int64
	// Random returns numbers in [0,1) for retry jitter; default math/rand. Tests fix it.
	Random func() float64
	// Processors are the contracts this server hosts in-process: a processor-wake subscription
	// (placement in-process) whose name is one of them runs it on its stream. nil hosts none,
	// and such a subscription halts at its first wake with the unknown-name error.
	Processors itx.ProcessorHost
}

// StreamRef names a stream: a project and a path.
type StreamRef struct {
	ProjectID string
	Path      string
}

// Server is the running set of streams under one data directory.
type Server struct {
	cfg     Config
	clock   itx.Clock
	log     zerolog.Logger
	dir     *storage.Directory
	metrics *Metrics
	// unlockDataDir lets go of the data directory's lock (lockDataDir), at the end of Close.
	unlockDataDir func()

	// base is cancelled by Close; barriers select on it so shutdown never waits for a timeout.
	base   context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	actors    map[StreamRef]*actor
	unloading map[StreamRef]*actor
	// fullReads holds the streams read from their database file alone while the disk is full
	// (openWhileFull): a load of one waits until those reads are done.
	fullReads map[StreamRef]*fullRead
	// deleting holds the streams being deleted (DeleteStream): a load of one waits for the end.
	deleting map[StreamRef]chan struct{}
	// heldBy counts, per project, its loaded streams held in use (refs above 0; under mu):
	// Config.MaxHeldStreamsPerProject.
	heldBy map[string]int
	// heldWaiting holds, per project, its loaded streams whose delivery tries (or processor
	// alarm fires) were refused at its share of the held streams (pinDelivery): each is told (a
	// tick) once the project holds a stream fewer than its share. Under mu.
	heldWaiting map[string]map[*actor]struct{}
	closing     bool
	inflight    sync.WaitGroup // one per acquired reference
	// backup is the backup in progress (backup.go); backupMu lets one run at a time.
	backup   *backupRun
	backupMu sync.Mutex
	backupT  itx.Timer // the next scheduled backup (under mu)
	// backupsArmed counts the scheduled backups armed (under mu), for tests to wait on.
	backupsArmed int
	sweepT       itx.Timer

	backend    streamBackend
	egress     EgressPolicy
	httpClient *http.Client
	webhooks   chan struct{} // one slot per webhook request in flight (MaxWebhooksInFlight)
	recv       receivers
	randMu     sync.Mutex

	trimMu   sync.Mutex
	lastTrim time.Time

	alarmMu   sync.Mutex
	alarmT    itx.Timer
	alarmNext int64 // epoch ms the alarm timer is armed for; 0: none
	// alarmSeen is the wall clock's reading (epoch ms) at the last wakeDue, and alarmSeenSaved
	// the last one written to the directory (clockSeenSetting): a later wakeDue reading less
	// finds the clock went back (see pullAfterStepBack). Guarded by alarmMu.
	alarmSeen, alarmSeenSaved int64
	// alarmsWaiting: the last wakeDue left streams with work due unloaded (a bound held them
	// back); their warning is logged once until a wakeDue loads every due stream again.
	alarmsWaiting atomic.Bool

	disk  *diskReserve // Config.MinFreeDisk
	quota usageBook    // Config.MaxProjectBytes
	// oldFiles holds the IDs of the streams whose file predates auto_vacuum and whose trim was
	// logged as not giving its space back: once per stream and process.
	oldFiles sync.Map
	// damaged holds, per stream ID, the last error noteDamaged logged for it, until the stream
	// loads again or is deleted: what Streams.list shows as unavailable (StreamInfo.Unavailable)
	// and itx_streams_unavailable counts.
	damaged sync.Map

	acc    *accessState // sessions by token, deleted projects, webhook secrets
	live   atomic.Int64 // live connections and live-state views open over every login (Config.MaxLive)
	shares *projectShares

	procHosts procHosts

	// incarnation names this process: stream/woken records carry it.
	incarnation string
	hosted      map[string]bool // the names of Config.Processors' contracts
	// procVersionChanged: Config.Processors runs another version than the last process did (the
	// antidote deploy); each stream's in-process alarm slice fires at its first step.
	procVersionChanged bool
}

// Credentials are the tokens created on a fresh data directory.
type Credentials struct {
	ProjectID       string `json:"projectId"`
	ProjectToken    string `json:"projectToken"`
	DeploymentToken string `json:"deploymentToken"`
}

// CredentialsFile is where a fresh data directory records its first tokens (mode 0600), so
// `make run` can print how to connect on every start.
const CredentialsFile = "credentials.json"

// Open opens (or initializes) the data directory and returns a running server. On an empty data
// directory it creates the default project and the deployment root and records their tokens.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("open server: no data directory")
	}
	if cfg.Processors != nil && cfg.Processors.Version() == "" {
		// Refused here, not at every stream's first wake: a host without a version cannot open
		// a processor registry (the crash-loop budget's reset is keyed by it).
		return nil, errors.New("open server: the processor host has no version (processors.NewHost(version): the build's, a new one resets every crash-loop budget)")
	}
	if cfg.Clock == nil {
		cfg.Clock = itx.SystemClock{}
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = itx.IdleActorTeardown
	}
	if err := checkBackupSchedule(&cfg); err != nil {
		return nil, fmt.Errorf("open server: %w", err)
	}
	if cfg.MaxLoadedStreams <= 0 {
		cfg.MaxLoadedStreams = 1024
	}
	if cfg.MaxHeldStreams <= 0 {
		cfg.MaxHeldStreams = 4096
	}
	// The idle sweep keeps the loaded streams within MaxLoadedStreams; above MaxHeldStreams it
	// let a stream load whenever one held was idle, so the loaded ones passed MaxHeldStreams (and
	// the descriptors it is derived from) up to MaxLoadedStreams.
	cfg.MaxLoadedStreams = min(cfg.MaxLoadedStreams, cfg.MaxHeldStreams)
	if cfg.MaxHeldStreamsPerProject <= 0 {
		cfg.MaxHeldStreamsPerProject = DefaultShare(cfg.MaxHeldStreams)
	}
	if cfg.BreakerBurst <= 0 {
		cfg.BreakerBurst = itx.BreakerBurst
	}
	if cfg.BreakerRefillPerMinute <= 0 {
		cfg.BreakerRefillPerMinute = itx.BreakerRefillPerMinute
	}
	if cfg.EphemeralRetention <= 0 {
		cfg.EphemeralRetention = time.Hour
	}
	if cfg.EphemeralBufferBytes <= 0 {
		cfg.EphemeralBufferBytes = itx.EphemeralBufferBytes
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = itx.MaxSubscriptionsPerStream
	}
	if cfg.MaxSubscriptionConfigBytes <= 0 {
		cfg.MaxSubscriptionConfigBytes = itx.MaxSubscriptionConfigBytes
	}
	if cfg.DeliveryTimeout <= 0 {
		cfg.DeliveryTimeout = defaultDeliveryTimeout
	}
	if cfg.CursorFlushDelay <= 0 {
		cfg.CursorFlushDelay = 200 * time.Millisecond
	}
	if cfg.MaxScheduledPerStream <= 0 {
		cfg.MaxScheduledPerStream = DefaultMaxScheduledPerStream
	}
	if cfg.MaxReadersPerStream <= 0 {
		cfg.MaxReadersPerStream = 1024
	}
	if cfg.MaxProcessorKVKeys <= 0 {
		cfg.MaxProcessorKVKeys = DefaultMaxProcessorKVKeys
	}
	if cfg.MaxProcessorKVBytes <= 0 {
		cfg.MaxProcessorKVBytes = DefaultMaxProcessorKVBytes
	}
	if cfg.MaxMountsPerProject <= 0 {
		cfg.MaxMountsPerProject = 4096
	}
	if cfg.MaxHostContractBytes <= 0 {
		cfg.MaxHostContractBytes = DefaultMaxHostContractBytes
	}
	if cfg.MaxWebhooksInFlight <= 0 {
		cfg.MaxWebhooksInFlight = 1024
	}
	if cfg.MaxWebhooksInFlightPerProject <= 0 {
		cfg.MaxWebhooksInFlightPerProject = DefaultShare(cfg.MaxWebhooksInFlight)
	}
	if cfg.MaxWebhookResponseHeaderBytes <= 0 {
		cfg.MaxWebhookResponseHeaderBytes = DefaultMaxWebhookResponseHeaderBytes
	}
	if cfg.MaxSecretsPerProject <= 0 {
		cfg.MaxSecretsPerProject = itx.MaxSecretsPerProject
	}
	if cfg.MaxTokensPerProject <= 0 {
		cfg.MaxTokensPerProject = itx.MaxTokensPerProject
	}
	if cfg.MaxStreamsPerProject <= 0 {
		cfg.MaxStreamsPerProject = itx.MaxStreamsPerProject
	}
	if cfg.MaxConnectionsPerStream <= 0 {
		cfg.MaxConnectionsPerStream = 16_384
	}
	if cfg.MaxLivePerSession <= 0 {
		cfg.MaxLivePerSession = 4096
	}
	if cfg.MaxLive <= 0 {
		cfg.MaxLive = DefaultMaxLive
	}
	if cfg.MaxLivePerProject <= 0 {
		cfg.MaxLivePerProject = DefaultShare(cfg.MaxLive)
	}
	if cfg.MaxRPCConnectionsPerProject <= 0 {
		cfg.MaxRPCConnectionsPerProject = DefaultShare(flowconn.DefaultConnections)
	}
	if cfg.MaxLiveSubscribersPerStream <= 0 {
		cfg.MaxLiveSubscribersPerStream = 1024
	}
	if cfg.Random == nil {
		cfg.Random = mrand.Float64
	}
	if err := prepareDataDir(cfg.DataDir, cfg.Log); err != nil {
		return nil, fmt.Errorf("open server: %w", err)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("open server: %w", err)
	}
	opened := false
	defer func() {
		if !opened {
			unlock()
		}
	}()
	removeDownloadScratch(cfg.DataDir)
	if err := checkDirectoryKept(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("open server: %w", err)
	}
	dir, err := storage.OpenDirectory(ctx, filepath.Join(cfg.DataDir, "directory.db"))
	if storage.Damaged(err) {
		return nil, fmt.Errorf("open server: the directory database %s is damaged (%w): restore the data directory from a backup (README, Damaged storage)",
			filepath.Join(cfg.DataDir, "directory.db"), err)
	}
	if err != nil {
		return nil, fmt.Errorf("open server: %w", err)
	}
	s := &Server{
		cfg: cfg, clock: cfg.Clock, log: cfg.Log, dir: dir, metrics: newMetrics(),
		actors: map[StreamRef]*actor{}, unloading: map[StreamRef]*actor{}, fullReads: map[StreamRef]*fullRead{}, deleting: map[StreamRef]chan struct{}{},
		egress: cfg.Egress, httpClient: newHTTPClient(cfg.Egress, cfg.MaxWebhookResponseHeaderBytes), webhooks: make(chan struct{}, cfg.MaxWebhooksInFlight),
		backend:     sqliteBackend{dir: filepath.Join(cfg.DataDir, "streams")},
		recv:        receivers{mounts: map[mountKey]*mount{}},
		acc:         newAccessState(),
		shares:      newProjectShares(),
		heldBy:      map[string]int{},
		heldWaiting: map[string]map[*actor]struct{}{},
		incarnation: newStreamID(), hosted: map[string]bool{},
		unlockDataDir: unlock,
	}
	if dir.MigratedFrom > 0 && dir.MigratedFrom != dir.MigratedTo {
		// An upgrade: the operator sees which schema the directory was at (streams migrate as
		// each is first opened, silently).
		s.log.Info().Int("from", dir.MigratedFrom).Int("to", dir.MigratedTo).Msg("upgraded the data directory's schema")
	}
	s.metrics.Registry.MustRegister(newStandingCollector(s), newQuotaCollector(s),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "itx_streams_unavailable",
			Help: "Streams that cannot be served from their database now (lost, damaged, or a file itxd may not open; their calls answer unavailable), as their last load or read since itxd started met them, until they load again or are deleted: alert on any (README, Damaged storage; Streams.list's unavailable names them).",
		}, func() float64 {
			n := 0
			s.damaged.Range(func(any, any) bool { n++; return true })
			return float64(n)
		}))
	if cfg.MinFreeDisk < 0 {
		cfg.MinFreeDisk = DefaultMinFreeDisk(cfg.DataDir)
		s.cfg.MinFreeDisk = cfg.MinFreeDisk
	}
	s.metrics.DiskReserve.Set(float64(cfg.MinFreeDisk))
	s.disk = newDiskReserve(cfg.DataDir, cfg.MinFreeDisk, cfg.Log, func(free int64) { s.metrics.DiskFree.Set(float64(free)) })
	// A first reading at start: itx_disk_free_bytes said 0 until the first append, so an alert
	// on it nearing the reserve fired after every restart; a start below the reserve is logged.
	_ = s.disk.room()
	// Read again at each scrape: it was read only by appends, so on a server nobody appended to
	// the gauge kept what it showed at the last one while another process filled the disk (the
	// alert on it nearing the reserve never fired), or while space was freed (it stayed below).
	s.metrics.Registry.MustRegister(refreshedCollector{refresh: func() { _ = s.disk.room() }, Collector: s.metrics.DiskFree})
	if cfg.Processors != nil {
		for _, c := range cfg.Processors.Contracts() {
			s.hosted[c.Name] = true
		}
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	if err := s.bootstrap(ctx); err != nil {
		dir.Close()
		return nil, err
	}
	if err := s.loadAccess(ctx); err != nil {
		dir.Close()
		return nil, fmt.Errorf("open server: %w", err)
	}
	if cfg.Processors != nil {
		// Before any stream loads: their first steps read what it decides.
		if err := s.checkProcessorsVersion(ctx); err != nil {
			s.log.Error().Err(err).Msg("reading the processors' version")
		}
	}
	if err := s.removeDeletedStreams(ctx); err != nil {
		s.log.Error().Err(err).Msg("the files of deleted streams are not all removed (tried again at the next start)")
	}
	s.refreshStaleSummaries(ctx)
	s.appendPendingAudits(ctx)
	s.scheduleSweep()
	s.scheduleBackups()
	go s.wakeDue()
	if s.procVersionChanged {
		go s.loadForNewVersion(cfg.Processors.Version())
	}
	opened = true
	return s, nil
}

// bootstrap creates the default project and the deployment root on an empty directory.
func (s *Server) bootstrap(ctx context.Context) error {
	projects, err := s.dir.Projects(ctx)
	if err != nil || len(projects) > 0 {
		return err
	}
	creds := Credentials{ProjectID: "default", ProjectToken: "itx_" + randomHex(24), DeploymentToken: "itxd_" + randomHex(24)}
	now := itx.UnixMilli(s.clock.Now())
	// The credentials file is written first: a crash after it but before the projects leaves a
	// file whose tokens are recreated below on the next start, never projects nobody can log into.
	b, _ := json.MarshalIndent(creds, "", "  ")
	if err := WriteFileDurably(filepath.Join(s.cfg.DataDir, CredentialsFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	// Both projects in one transaction: a crash between two would leave the deployment root
	// alone, a directory this function no longer treats as empty, and a credentials file whose
	// project token logs into nothing, for good.
	if err := s.dir.CreateProjectsWithTokens(ctx, []storage.NewProject{
		{Project: storage.Project{ID: DeploymentProjectID, Name: "deployment", Deployment: true, CreatedAt: now},
			Token:  storage.Token{ID: "tok_" + DeploymentProjectID, ProjectID: DeploymentProjectID, Label: "initial", CreatedAt: now},
			Secret: creds.DeploymentToken},
		{Project: storage.Project{ID: creds.ProjectID, Name: "default", CreatedAt: now},
			Token:  storage.Token{ID: "tok_" + creds.ProjectID, ProjectID: creds.ProjectID, Label: "initial", CreatedAt: now},
			Secret: creds.ProjectToken},
	}, nil); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	s.log.Info().Str("project", creds.ProjectID).Msg("initialized an empty data directory")
	return nil
}

// DeploymentProjectID is the deployment root's project id: its streams are global.
const DeploymentProjectID = "deployment"

// ReadCredentials reads the tokens recorded when dataDir was initialized.
func ReadCredentials(dataDir string) (Credentials, error) {
	var c Credentials
	b, err := os.ReadFile(filepath.Join(dataDir, CredentialsFile))
	if err != nil {
		return c, err
	}
	return c, json.Unmarshal(b, &c)
}

// Login resolves a token to its project (OpenSession also keeps track of the login, so that a
// revocation reaches it).
func (s *Server) Login(ctx context.Context, token string) (itx.ProjectInfo, error) {
	t, p, err := s.dir.TokenByHash(ctx, token, itx.UnixMilli(s.clock.Now()))
	if err != nil {
		return itx.ProjectInfo{}, err
	}
	if s.projectDeleted(t.ProjectID) {
		return itx.ProjectInfo{}, itx.Errorf(itx.EUnauthenticated, "unknown token")
	}
	return itx.ProjectInfo{ID: p.ID, Name: p.Name, Deployment: p.Deployment}, nil
}

// Metrics returns the server's instruments.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Log returns the server's logger.
func (s *Server) Log() zerolog.Logger { return s.log }

// Close stops accepting work, lets every call that already holds a stream finish (in-flight
// appends commit and are answered), then unloads every stream and closes the databases. Barriers
// waiting on a stream return EUnavailable at once. ctx bounds the wait for in-flight calls.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	if s.sweepT != nil {
		s.sweepT.Stop()
	}
	if s.backupT != nil {
		s.backupT.Stop()
	}
	// Cancelled under mu: acquire (closing) and pin (the actors' contexts) check and count an
	// in-flight use under mu too, so none can be added once the wait below starts.
	s.cancel()
	s.mu.Unlock()
	s.alarmMu.Lock()
	if s.alarmT != nil {
		s.alarmT.Stop()
	}
	s.alarmMu.Unlock()

	drained := make(chan struct{})
	go func() { s.inflight.Wait(); close(drained) }()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = fmt.Errorf("in-flight calls did not finish, %s: %w", s.heldStreams(), ctx.Err())
		// Said now: closing the streams under those calls may itself wait on them (a commit
		// stuck in a failing disk's fsync).
		s.log.Error().Err(err).Msg("shutdown: stopped waiting for in-flight calls (--shutdown-timeout); closing their streams under them")
	}

	s.mu.Lock()
	actors := make([]*actor, 0, len(s.actors))
	for _, a := range s.actors {
		actors = append(actors, a)
	}
	s.actors = map[StreamRef]*actor{}
	s.mu.Unlock()
	// Several at a time, as a sweep unloads them: each checkpoints its database and writes its
	// summary (fsyncs). One after another, 1,024 loaded streams took 23 s to close on a busy
	// machine, past the grace a supervisor gives before its SIGKILL (an unclean stop, which the
	// next start pays for again).
	inParallel(actors, func(a *actor) {
		if closeUnloadHook != nil {
			closeUnloadHook()
		}
		a.unload()
	})
	err = errors.Join(err, s.dir.Close())
	s.unlockDataDir()
	return err
}

// closeUnloadHook, when set (tests), runs in Close before each stream's unload.
var closeUnloadHook func()

// heldStreams says which loaded streams calls or deliveries still hold (at most 5 named): what
// a shutdown that timed out waited for.
func (s *Server) heldStreams() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	n := 0
	note := func(a *actor) {
		if a.refs <= 0 {
			return
		}
		n++
		if len(names) < 5 {
			holders := "1 holder"
			if a.refs > 1 {
				holders = fmt.Sprintf("%d holders", a.refs)
			}
			names = append(names, fmt.Sprintf("%s in project %s (%s)", a.ref.Path, a.ref.ProjectID, holders))
		}
	}
	for _, a := range s.actors {
		note(a)
	}
	for _, a := range s.unloading {
		note(a)
	}
	switch {
	case n == 0:
		return "no stream is held: a call not on a stream, or one releasing its stream"
	case n > len(names):
		return fmt.Sprintf("%d streams still held by calls or deliveries, among them %s", n, strings.Join(names, ", "))
	case n == 1:
		return "1 stream still held by calls or deliveries: " + names[0]
	}
	return fmt.Sprintf("%d streams still held by calls or deliveries: %s", n, strings.Join(names, ", "))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newStreamID returns a random UUID (version 4), the stream's identity for its lifetime.
func newStreamID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// WriteFileDurably replaces name with data so that a crash or a power cut leaves either the old
// file or the new one, whole: written to a temporary file beside it, fsynced, renamed over it,
// and the directory fsynced so that the rename itself survives.
func WriteFileDurably(name string, data []byte, mode os.FileMode) error {
	tmp := name + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	dir, err := os.Open(filepath.Dir(name))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

func (s *Server) random() float64 {
	s.randMu.Lock()
	defer s.randMu.Unlock()
	return s.cfg.Random()
}

// defaultDeliveryTimeout is Config.DeliveryTimeout's default: itx.DeliveryTimeout, except in a
// test build of itxd (testhooks_itxtest.go).
var defaultDeliveryTimeout = itx.DeliveryTimeout
