package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/rs/zerolog"
)

// The disk reserve: appends that add events are refused (resourceExhausted, writing nothing)
// while the file system holding the data directory has less than Config.MinFreeDisk free, so
// that a client filling the disk never takes it to its last byte. What runs below the reserve
// is what frees space or needs little of it: deleting and trimming streams (SQLite logs a delete
// before it frees pages; on a disk with nothing left at all they fail too), delivery progress,
// the server's own records, reads.

// MaxDefaultMinFreeDisk caps the default reserve (DefaultMinFreeDisk).
const MaxDefaultMinFreeDisk = 256 << 20

// DefaultMinFreeDisk is the reserve itxd keeps on the file system holding dir unless told
// otherwise: a hundredth of its size, at most MaxDefaultMinFreeDisk (0 where the size is unknown).
func DefaultMinFreeDisk(dir string) int64 {
	size, ok := diskSize(dir)
	if !ok {
		return 0
	}
	return min(size/100, MaxDefaultMinFreeDisk)
}

// DiskReserve is the space this server keeps free on its data directory's disk (0: none).
func (s *Server) DiskReserve() int64 { return s.cfg.MinFreeDisk }

// diskReadingTTL is how long a reading of the free space above the reserve is trusted.
const diskReadingTTL = 250 * time.Millisecond

// diskReserve decides whether the data directory's disk has room above the reserve. It reads
// the file system's free space (statfs, a few microseconds) only when the last reading may no
// longer hold: after diskReadingTTL (what other processes write is seen that late), once the bytes committed since then could have used half the
// margin it showed, and on every check while it showed too little (so an append succeeds as
// soon as space returns). Safe for concurrent use by every stream's actor.
type diskReserve struct {
	dir     string
	reserve int64 // bytes; 0: no reserve
	free    func(string) (int64, bool)
	now     func() time.Time
	log     zerolog.Logger
	metric  func(free int64) // the last reading, for /metrics

	mu      sync.Mutex
	at      time.Time // of the last reading (zero: none yet)
	margin  int64     // free - reserve at the last reading (<= 0: below the reserve)
	written atomic.Int64
}

func newDiskReserve(dir string, reserve int64, log zerolog.Logger, metric func(int64)) *diskReserve {
	return &diskReserve{dir: dir, reserve: reserve, free: freeBytes, now: time.Now, log: log, metric: metric}
}

// room is nil while the disk has room above the reserve, else the resourceExhausted error an
// append that adds events is refused with.
func (d *diskReserve) room() error {
	if d == nil {
		return nil
	}
	if d.reserve <= 0 {
		d.show()
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if !d.at.IsZero() && now.Sub(d.at) < diskReadingTTL && 2*d.written.Load() < d.margin { // (so margin > 0)
		return nil
	}
	free, ok := d.free(d.dir)
	if !ok {
		return nil // unknown here: a full disk is still refused by the commit that meets it
	}
	was := !d.at.IsZero() && d.margin <= 0
	d.at, d.margin = now, free-d.reserve
	d.written.Store(0)
	if d.metric != nil {
		d.metric(free)
	}
	switch {
	case d.margin <= 0 && !was:
		d.log.Warn().Int64("free", free).Int64("reserve", d.reserve).Str("dir", d.dir).
			Msg("the data directory's disk is below its reserve (--min-free-disk-bytes): appends are refused until space is freed")
	case d.margin > 0 && was:
		d.log.Info().Int64("free", free).Int64("reserve", d.reserve).Msg("the data directory's disk is above its reserve again: appends are taken")
	}
	if d.margin > 0 {
		return nil
	}
	return itx.Errorf(itx.EResourceExhausted,
		"the data directory's disk has %d bytes free, less than the %d bytes itxd keeps in reserve (--min-free-disk-bytes): nothing was written; appends are refused until space is freed (delete or trim streams)",
		free, d.reserve)
}

// show keeps /metrics' free space current where there is no reserve to check: read at most
// every diskReadingTTL (itx_disk_free_bytes said 0 for good with --min-free-disk-bytes -1, so an
// alert on it fired at once, or was turned off and missed a filling disk).
func (d *diskReserve) show() {
	if d.metric == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if !d.at.IsZero() && now.Sub(d.at) < diskReadingTTL {
		return
	}
	d.at = now
	if free, ok := d.free(d.dir); ok {
		d.metric(free)
	}
}

// wrote counts bytes committed since the last reading.
func (d *diskReserve) wrote(n int64) {
	if d != nil && d.reserve > 0 {
		d.written.Add(n)
	}
}
