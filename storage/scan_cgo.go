//go:build cgo

package storage

/*
// The SQLite that mattn/go-sqlite3 compiles into this binary, declared here because mattn does
// not export its header or its connection handle.
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;
typedef long long itx_i64;
extern int sqlite3_open_v2(const char*, sqlite3**, int, const char*);
extern int sqlite3_close_v2(sqlite3*);
extern int sqlite3_exec(sqlite3*, const char*, void*, void*, char**);
extern int sqlite3_prepare_v2(sqlite3*, const char*, int, sqlite3_stmt**, const char**);
extern int sqlite3_finalize(sqlite3_stmt*);
extern int sqlite3_reset(sqlite3_stmt*);
extern int sqlite3_bind_int64(sqlite3_stmt*, int, itx_i64);
extern int sqlite3_step(sqlite3_stmt*);
extern int sqlite3_column_type(sqlite3_stmt*, int);
extern itx_i64 sqlite3_column_int64(sqlite3_stmt*, int);
extern const unsigned char* sqlite3_column_text(sqlite3_stmt*, int);
extern int sqlite3_column_bytes(sqlite3_stmt*, int);
extern const char* sqlite3_errmsg(sqlite3*);
extern const char* sqlite3_errstr(int);

#include <stdlib.h>
#include <string.h>

#define ITX_ROW 100
#define ITX_DONE 101
#define ITX_NULL 5
#define ITX_FULL (-1)
#define ITX_ROW_HEADER 40

// itx_scan runs a prepared range query (offset > ?1 and offset <= ?2 ... limit ?3, the columns
// of eventColumns) to its end or to limit rows in one C call, packing each row into buf:
// offset, created_at (int64), ephemeral, then the byte lengths of type, payload, metadata,
// idempotency_key and provenance (int32, -1 for NULL), then those bytes. With maxbytes > 0 it
// also stops after the row that brings the size of the rows it packed (type, payload, metadata
// and key: itx.Event.Size) to maxbytes or more, without stepping to the next. The statement is
// reset before it returns, which ends the read transaction. When the next row does not fit it
// returns ITX_FULL with *need set to what buf would need to hold it too; the rows before it are
// whole, and *size is their size.
static int itx_scan(sqlite3_stmt* st, itx_i64 after, itx_i64 upto, int limit, itx_i64 maxbytes,
		unsigned char* buf, int cap, int* used, int* rows, int* need, itx_i64* size) {
	static const int textCols[5] = {1, 2, 3, 4, 7};
	int rc = 0, n = 0, off = 0;
	itx_i64 total = 0;
	sqlite3_reset(st);
	sqlite3_bind_int64(st, 1, after);
	sqlite3_bind_int64(st, 2, upto);
	sqlite3_bind_int64(st, 3, limit);
	while (n < limit && (maxbytes <= 0 || total < maxbytes)) {
		const unsigned char* ptr[5];
		int len[5], size = ITX_ROW_HEADER, i;
		itx_i64 v[2];
		int eph;
		rc = sqlite3_step(st);
		if (rc == ITX_DONE) {
			rc = 0;
			break;
		}
		if (rc != ITX_ROW) {
			break;
		}
		for (i = 0; i < 5; i++) {
			if (sqlite3_column_type(st, textCols[i]) == ITX_NULL) {
				ptr[i] = 0;
				len[i] = -1;
				continue;
			}
			ptr[i] = sqlite3_column_text(st, textCols[i]);
			len[i] = sqlite3_column_bytes(st, textCols[i]);
			size += len[i];
		}
		if (off + size > cap) {
			*need = off + size;
			rc = ITX_FULL;
			break;
		}
		v[0] = sqlite3_column_int64(st, 0);
		v[1] = sqlite3_column_int64(st, 5);
		eph = (int)sqlite3_column_int64(st, 6);
		memcpy(buf + off, v, 16);
		memcpy(buf + off + 16, &eph, 4);
		memcpy(buf + off + 20, len, 20);
		off += ITX_ROW_HEADER;
		for (i = 0; i < 5; i++) {
			if (len[i] > 0) {
				memcpy(buf + off, ptr[i], len[i]);
				off += len[i];
				if (i < 4) {
					total += len[i];
				}
			}
		}
		n++;
		rc = 0;
	}
	sqlite3_reset(st);
	*used = off;
	*rows = n;
	*size = total;
	return rc;
}
*/
import "C"

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/itx-dev/itx"
	sqlite3 "github.com/mattn/go-sqlite3"
)

// scanner is one read connection opened directly on the SQLite that mattn/go-sqlite3 links in,
// with the two catch-up queries prepared. A page is read in one C call (itx_scan) into one Go
// buffer that the page's events then point into, instead of one cgo call, a dozen driver.Value
// conversions and a dozen allocations per row through database/sql (together 60% of a catch-up
// page's CPU, measured by BenchmarkStream_Events). It reads only: durability is the writer's.
type scanner struct {
	db      *C.sqlite3
	all     *C.sqlite3_stmt
	durable *C.sqlite3_stmt
	used    time.Time // when it last went back to the pool
}

const (
	sqliteOpenReadWrite = 0x2    // as mattn's mode=rw: WAL readers write the -shm index
	sqliteOpenNoMutex   = 0x8000 // one goroutine at a time holds a scanner (scanPool)
	scanRowHeader       = 40     // ITX_ROW_HEADER
)

func openScanner(file string) (*scanner, error) {
	cfile := C.CString(file)
	defer C.free(unsafe.Pointer(cfile))
	sc := &scanner{}
	if rc := C.sqlite3_open_v2(cfile, &sc.db, sqliteOpenReadWrite|sqliteOpenNoMutex, nil); rc != 0 {
		err := sc.err("open", rc)
		sc.close()
		return nil, err
	}
	// The pragmas of the itx driver that matter to a reader (sqlite.go); journal_mode is the
	// file's, and a reader never commits, so synchronous does not apply.
	if err := sc.exec("PRAGMA busy_timeout=10000; PRAGMA cache_size=-512;"); err != nil {
		sc.close()
		return nil, err
	}
	for _, p := range []struct {
		stmt **C.sqlite3_stmt
		q    string
	}{
		{&sc.all, readAllQuery},
		{&sc.durable, readDurableQuery},
	} {
		cq := C.CString(p.q)
		rc := C.sqlite3_prepare_v2(sc.db, cq, -1, p.stmt, nil)
		C.free(unsafe.Pointer(cq))
		if rc != 0 {
			err := sc.err("prepare", rc)
			sc.close()
			return nil, err
		}
	}
	return sc, nil
}

func (sc *scanner) exec(q string) error {
	cq := C.CString(q)
	defer C.free(unsafe.Pointer(cq))
	if rc := C.sqlite3_exec(sc.db, cq, nil, nil, nil); rc != 0 {
		return sc.err("exec", rc)
	}
	return nil
}

func (sc *scanner) err(verb string, rc C.int) error {
	msg := C.GoString(C.sqlite3_errstr(rc))
	if sc.db != nil {
		msg = C.GoString(C.sqlite3_errmsg(sc.db))
	}
	return scanError{msg: fmt.Sprintf("%s: sqlite error %d: %s", verb, int(rc), msg),
		code: sqlite3.Error{Code: sqlite3.ErrNo(rc & 0xff), ExtendedCode: sqlite3.ErrNoExtended(rc)}}
}

// scanError is a scan's failure carrying SQLite's code as mattn's errors do, so ErrorCode and
// Damaged read it alike: a damaged page met by a scan answered internal, not unavailable.
type scanError struct {
	msg  string
	code sqlite3.Error
}

func (e scanError) Error() string { return e.msg }
func (e scanError) Unwrap() error { return e.code }

func (sc *scanner) close() {
	if sc.all != nil {
		C.sqlite3_finalize(sc.all)
	}
	if sc.durable != nil {
		C.sqlite3_finalize(sc.durable)
	}
	if sc.db != nil {
		C.sqlite3_close_v2(sc.db)
	}
	*sc = scanner{}
}

// maxScanBuffer bounds a scan buffer's size before the rows show they need more.
const maxScanBuffer = 4 << 20

// events reads the page q names (q.Types empty); bytesPerRow sizes the buffer.
func (sc *scanner) events(q Query, bytesPerRow int) ([]itx.Event, error) {
	st := sc.durable
	if q.IncludeEphemeral {
		st = sc.all
	}
	limit := min(q.Limit, 1<<30)
	// Size the first buffer for the rows the range can hold, not the limit asked for (a caller
	// reading "everything" passes a huge one), and at most maxScanBuffer, or for a page bounded
	// by size what the bound lets it hold (its bytes and one more row, with slack): it grows as
	// needed, but a page of large events is then usually read in one call.
	rows := int(min(int64(limit), max(q.UpTo-q.After, 0)))
	ceiling := maxScanBuffer
	if q.MaxBytes > 0 {
		ceiling = min(q.MaxBytes, maxScanBuffer) + 2*bytesPerRow
	}
	buf := make([]byte, min(max(rows*bytesPerRow, 4096), ceiling))
	var events []itx.Event
	after := q.After
	maxBytes := int64(q.MaxBytes) // what the page may still take; 0: no bound
	for {
		var used, rows, need C.int
		var size C.itx_i64
		rc := C.itx_scan(st, C.itx_i64(after), C.itx_i64(q.UpTo), C.int(limit), C.itx_i64(maxBytes),
			(*C.uchar)(unsafe.Pointer(&buf[0])), C.int(len(buf)), &used, &rows, &need, &size)
		if rc != 0 && rc != -1 {
			return nil, sc.err("read events", rc)
		}
		if events == nil {
			events = make([]itx.Event, 0, min(limit, 1024))
		}
		var err error
		if events, err = decodeScan(events, buf[:used], int(rows)); err != nil {
			return nil, err
		}
		if rc == 0 {
			return events, nil
		}
		// The buffer filled: read the rest of the page into a new one, large enough for at
		// least the row that did not fit. The events so far keep the old buffer, and count
		// against the page's size bound (it is not reached: the scan stops there).
		limit -= int(rows)
		if maxBytes > 0 {
			maxBytes -= int64(size)
		}
		if len(events) > 0 {
			after = events[len(events)-1].Offset
		}
		buf = make([]byte, max(int(need)-int(used), min(limit*bytesPerRow, maxScanBuffer), 2*len(buf)))
	}
}

// decodeScan appends the rows itx_scan packed into buf. Strings and payloads point into buf,
// which nothing writes again.
func decodeScan(events []itx.Event, buf []byte, rows int) ([]itx.Event, error) {
	le := binary.NativeEndian
	off := 0
	for range rows {
		h := buf[off : off+scanRowHeader]
		e := itx.Event{
			Offset:    int64(le.Uint64(h[0:])),
			CreatedAt: int64(le.Uint64(h[8:])),
			Ephemeral: le.Uint32(h[16:]) != 0,
		}
		off += scanRowHeader
		var col [5][]byte // type, payload, metadata, idempotency_key, provenance
		for i := range col {
			n := int(int32(le.Uint32(h[20+4*i:])))
			if n < 0 {
				continue
			}
			col[i] = buf[off : off+n : off+n]
			off += n
		}
		if len(col[0]) > 0 {
			e.Type = unsafe.String(&col[0][0], len(col[0]))
		}
		e.Payload = json.RawMessage(col[1])
		if e.Payload == nil {
			e.Payload = json.RawMessage{}
		}
		if col[2] != nil {
			e.Metadata = json.RawMessage(col[2])
		}
		if len(col[3]) > 0 {
			e.IdempotencyKey = unsafe.String(&col[3][0], len(col[3]))
		}
		if col[4] != nil {
			var hops []itx.Hop // not &e.Provenance: e would then escape, one allocation a row
			if err := json.Unmarshal(col[4], &hops); err != nil {
				return nil, fmt.Errorf("read events: offset %d provenance: %w", e.Offset, err)
			}
			e.Provenance = hops
		}
		events = append(events, e)
	}
	return events, nil
}

// scanPool holds a stream's scanners: at most ReaderConns open at once (a reader beyond that waits
// for one, as database/sql's pool made it wait), and any left unused for ReaderIdleTime closed:
// every SQLite connection holds memory, and most loaded streams are not read.
type scanPool struct {
	file  string
	slots chan struct{} // one per scanner in use
	mu    sync.Mutex
	idle  []*scanner
	sweep *time.Timer
	shut  bool
	// bytesPerRow is the last page's average row size plus slack, so a page's buffer is
	// usually allocated once.
	bytesPerRow int
}

func newScanPool(file string) *scanPool {
	return &scanPool{file: file, slots: make(chan struct{}, ReaderConns), bytesPerRow: 256}
}

// events reads a page on an idle scanner, or on a new one.
func (p *scanPool) events(ctx context.Context, q Query) ([]itx.Event, error) {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("read events: %w", ctx.Err())
	}
	defer func() { <-p.slots }()
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return nil, fmt.Errorf("read events: the stream is closed")
	}
	var sc *scanner
	if n := len(p.idle); n > 0 {
		sc, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	hint := p.bytesPerRow
	p.mu.Unlock()
	if sc == nil {
		var err error
		if sc, err = openScanner(p.file); err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
	}
	events, err := sc.events(q, hint)
	p.put(sc, events)
	return events, err
}

func (p *scanPool) put(sc *scanner, events []itx.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A page of a few events says little about the next, unless they are large: a page bounded
	// by size holds only a few of those.
	if len(events) > 0 {
		size := pageBytes(events)
		if len(events) >= 16 || size >= 1<<20 {
			p.bytesPerRow = scanRowHeader + size/len(events) + 32
		}
	}
	if p.shut || len(p.idle) >= ReaderConns {
		sc.close()
		return
	}
	sc.used = time.Now()
	p.idle = append(p.idle, sc)
	if p.sweep == nil {
		p.sweep = time.AfterFunc(ReaderIdleTime, p.closeIdle)
	}
}

// closeIdle closes the scanners unused for ReaderIdleTime, and looks again later if any remain.
func (p *scanPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep = nil
	keep := p.idle[:0]
	var next time.Duration
	for _, sc := range p.idle {
		if idle := time.Since(sc.used); idle >= ReaderIdleTime {
			sc.close()
		} else {
			keep = append(keep, sc)
			next = max(next, ReaderIdleTime-idle)
		}
	}
	clear(p.idle[len(keep):])
	p.idle = keep
	if len(keep) > 0 && !p.shut {
		p.sweep = time.AfterFunc(next, p.closeIdle)
	}
}

// close closes the idle scanners; one in use is closed when it comes back.
func (p *scanPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shut = true
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	for _, sc := range p.idle {
		sc.close()
	}
	p.idle = nil
}
