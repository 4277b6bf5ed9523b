// Package storage is SQLite access for one stream's log and for the server directory. It holds
// no goroutines and knows nothing of RPC: the stream actor in server/ is its only writer.
package storage

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// driverName is mattn's driver with the pragmas every itx connection must carry. mattn is built
// with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1, so WAL silently means synchronous=NORMAL (survives a
// process crash, not a power loss) unless each connection sets FULL; openDB reads it back.
const driverName = "sqlite3_itx"

func init() {
	if rc := configureSQLite(); rc != 0 {
		panic(fmt.Sprintf("sqlite3_config: error %d (a connection was opened before storage's init)", rc))
	}
	sql.Register(driverName, &sqlite3.SQLiteDriver{ConnectHook: itxPragmas})
}

// itxPragmas sets the pragmas every itx connection carries.
func itxPragmas(c *sqlite3.SQLiteConn) error {
	for _, p := range []string{
		"PRAGMA journal_mode=WAL",
		"PRAGMA synchronous=FULL",
		"PRAGMA foreign_keys=ON",
		"PRAGMA busy_timeout=10000",
		// A small page cache per connection: a server holds many streams open.
		"PRAGMA cache_size=-512",
	} {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// countingConnector opens connections of the itx driver that count the write transactions they
// commit (SQLite's commit hook runs for those only): Directory.Commits.
type countingConnector struct {
	dsn     string
	commits *atomic.Int64
	driver  *sqlite3.SQLiteDriver
}

func newCountingConnector(dsn string, commits *atomic.Int64) *countingConnector {
	return &countingConnector{dsn: dsn, commits: commits, driver: &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			c.RegisterCommitHook(func() int { commits.Add(1); return 0 })
			return itxPragmas(c)
		},
	}}
}

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	return c.driver.Open(c.dsn)
}
func (c *countingConnector) Driver() driver.Driver { return c.driver }

// openDriver and openDSNSuffix are what openPool opens: the itx driver, or, in the power-cut
// test, a driver over a VFS that drops unsynced writes (powercut_test.go).
var (
	openDriver    = driverName
	openDSNSuffix = ""
)

//go:embed migrations
var migrations embed.FS

// openDB opens (creating if allowed) the SQLite file at path with the itx pragmas, and checks
// the durability setting on a connection it then keeps for writing. params are more of mattn's
// DSN parameters ("&_name=value"), applied on each connection before the itx pragmas.
func openDB(path string, create bool, maxConns int, params ...string) (*sql.DB, error) {
	return openCountedDB(path, create, maxConns, nil, params...)
}

// openCountedDB is openDB counting the write transactions committed into commits (nil: not
// counted; nor in the power-cut test, whose driver is its own).
func openCountedDB(path string, create bool, maxConns int, commits *atomic.Int64, params ...string) (*sql.DB, error) {
	db, err := openPool(path, create, maxConns, commits, params...)
	if err != nil {
		return nil, err
	}
	var sync int
	if err := db.QueryRow("PRAGMA synchronous").Scan(&sync); err != nil {
		db.Close()
		return nil, err
	}
	if sync != 2 {
		db.Close()
		return nil, fmt.Errorf("open %s: synchronous is %d, want 2 (FULL)", path, sync)
	}
	return db, nil
}

// openPool opens a connection pool without connecting: connections open on first use.
func openPool(path string, create bool, maxConns int, commits *atomic.Int64, params ...string) (*sql.DB, error) {
	mode := "rw"
	if create {
		mode = "rwc"
		if err := createPrivate(path); err != nil {
			return nil, err
		}
	}
	// _mutex=no opens the connection without SQLite's per-connection mutex (SQLITE_OPEN_NOMUTEX):
	// database/sql hands a connection to one goroutine at a time and locks it around every driver
	// call, so the mutex only cost a lock and unlock per sqlite3_step and per column read (10% of
	// a catch-up scan's CPU, measured with perf).
	dsn := fileURI(path) + "?mode=" + mode + "&_txlock=immediate&_mutex=no" + strings.Join(params, "") + openDSNSuffix
	var db *sql.DB
	if commits != nil && openDriver == driverName {
		db = sql.OpenDB(newCountingConnector(dsn, commits))
	} else {
		var err error
		if db, err = sql.Open(openDriver, dsn); err != nil {
			return nil, err
		}
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db, nil
}

// fileURI is path as the "file:" URI every database is opened by (its parameters follow a '?').
// SQLite reads the URI's path up to a '?' or '#' and decodes %HH in it, and mattn takes its own
// parameters from the first '?': a path holding any of the three is written escaped, or a data
// directory such as /srv/itx#2 had its databases opened at /srv/itx.
func fileURI(path string) string { return "file:" + uriPathEscaper.Replace(path) }

var uriPathEscaper = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23")

// FileMode is the mode of every database file itx creates. SQLite gives a database's -wal and
// -shm files the mode of the database itself, so creating the (empty, hence valid) database file
// here with 0600 before SQLite opens it keeps all three private whatever the umask.
const FileMode = 0o600

func createPrivate(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, FileMode)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return f.Close()
}

// ErrSchemaTooNew is what opening a database written by a newer itxd says: its user_version is
// above every migration this build knows, so its tables may hold what this build would misread
// or rewrite. Downgrading is not supported; run the newer itxd (see README, Upgrading).
var ErrSchemaTooNew = errors.New("the database was written by a newer itxd")

// migrationStep is one numbered .sql file of a migration set.
type migrationStep struct {
	version int
	name    string
}

// migrationSteps lists the .sql files of migrations/<set> in version order.
func migrationSteps(set string) ([]migrationStep, error) {
	dir := "migrations/" + set
	entries, err := fs.ReadDir(migrations, dir)
	if err != nil {
		return nil, err
	}
	var steps []migrationStep
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration %s/%s: name must be NNN_name.sql", set, e.Name())
		}
		steps = append(steps, migrationStep{v, e.Name()})
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i].version < steps[j].version })
	return steps, nil
}

// latestVersion is the user_version a database of set has once every migration ran.
func latestVersion(set string) (int, error) {
	steps, err := migrationSteps(set)
	if err != nil || len(steps) == 0 {
		return 0, err
	}
	return steps[len(steps)-1].version, nil
}

// migrate applies the numbered .sql files of migrations/<set> above the database's user_version
// in one transaction with the version bump, so a crash leaves the database as it was or at the
// last version, and a new database costs one commit (one fsync) however many files there are.
// A database above the last known version is refused (ErrSchemaTooNew) and left untouched. It
// returns the version the database was at and the one it is at now (equal: nothing to do; from
// 0: a new database).
func migrate(ctx context.Context, db *sql.DB, set string) (from, to int, err error) {
	var current int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&current); err != nil {
		return 0, 0, err
	}
	to, err = migrateFrom(ctx, db, set, current)
	return current, to, err
}

func migrateFrom(ctx context.Context, db *sql.DB, set string, current int) (int, error) {
	dir := "migrations/" + set
	steps, err := migrationSteps(set)
	if err != nil {
		return current, err
	}
	if n := len(steps); n > 0 && current > steps[n-1].version {
		return current, fmt.Errorf("%w: its %s schema is version %d, this itxd knows up to %d; run the itxd that wrote it or a newer one (downgrading is not supported)",
			ErrSchemaTooNew, set, current, steps[n-1].version)
	}
	var tx *sql.Tx
	last := current
	for _, s := range steps {
		if s.version <= current {
			continue
		}
		body, err := migrations.ReadFile(dir + "/" + s.name)
		if err != nil {
			return current, err
		}
		if tx == nil {
			if tx, err = db.BeginTx(ctx, nil); err != nil {
				return current, err
			}
			defer tx.Rollback()
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			return current, fmt.Errorf("migration %s/%s: %w", set, s.name, err)
		}
		last = s.version
	}
	if tx == nil {
		return current, nil
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version=%d", last)); err != nil {
		return current, err
	}
	if err := tx.Commit(); err != nil {
		return current, fmt.Errorf("migrations %s up to version %d: commit: %w", set, last, err)
	}
	return last, nil
}
