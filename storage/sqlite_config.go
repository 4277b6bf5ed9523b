//go:build cgo

package storage

/*
// mattn/go-sqlite3 compiles SQLite into this binary but does not expose sqlite3_config.
extern int sqlite3_config(int, ...);

// SQLITE_CONFIG_PAGECACHE with no buffer: each connection's page cache then grows one page at a
// time instead of claiming 20 pages (about 85 KB) at its first statement. A server keeps one
// connection per loaded stream, a thousand or more of them, most holding a handful of pages.
static int itx_lazy_page_cache(void) { return sqlite3_config(7, (void*)0, 0, 0); }
*/
import "C"

// configureSQLite runs before any connection opens (SQLite refuses configuration after).
func configureSQLite() int { return int(C.itx_lazy_page_cache()) }
