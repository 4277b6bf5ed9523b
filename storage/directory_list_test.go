package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mustListDirectory opens a directory holding the given paths in project p, and one stream of
// another project beside them.
func mustListDirectory(t *testing.T, paths []string) *Directory {
	t.Helper()
	ctx := context.Background()
	d, err := OpenDirectory(ctx, filepath.Join(t.TempDir(), "dir.db"))
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	for _, p := range []string{"p", "q"} {
		require.NoError(t, d.CreateProjectWithToken(ctx, Project{ID: p, Name: p, CreatedAt: 1}, Token{ID: "t" + p, ProjectID: p, CreatedAt: 1}, "tok"+p, nil))
	}
	for _, path := range paths {
		require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: "p" + path, ProjectID: "p", Path: path, CreatedAt: 2}, 0))
	}
	require.NoError(t, d.CreateStream(ctx, StreamEntry{StreamID: "q/in/x", ProjectID: "q", Path: "/in/x", CreatedAt: 2}, 0))
	return d
}

func TestDirectory_ListStreamsUnder(t *testing.T) {
	ctx := context.Background()
	paths := []string{"/", "/a", "/i", "/in", "/in-x", "/in.b", "/in/x", "/in/x/y", "/in/xy", "/in0", "/ino", "/in~", "/z", "/~"} // in byte order
	d := mustListDirectory(t, paths)

	t.Run("the page a filter of every entry gives", func(t *testing.T) {
		under := func(path, scope string) bool {
			return scope == "" || scope == "/" || path == scope || strings.HasPrefix(path, scope+"/")
		}
		for _, scope := range []string{"", "/", "/in", "/in/x", "/a", "/q"} {
			for _, prefix := range []string{"", "/", "/i", "/in", "/in-", "/in/", "/in/x", "/in~", "/z", "/~", "/~~"} {
				for _, after := range []string{"", "/", "/in", "/in-x", "/in/x", "/in/x/y", "/zz"} {
					for _, limit := range []int{1, 2, 100} {
						var want []string
						for _, p := range paths {
							if strings.HasPrefix(p, prefix) && p > after && under(p, scope) && len(want) < limit {
								want = append(want, p)
							}
						}
						entries, err := d.ListStreamsUnder(ctx, "p", scope, prefix, after, limit)
						require.NoError(t, err)
						var got []string
						for _, e := range entries {
							got = append(got, e.Path)
						}
						if !slices.Equal(got, want) {
							t.Errorf("scope %q prefix %q after %q limit %d: got %q, want %q", scope, prefix, after, limit, got, want)
						}
					}
				}
			}
			if scope != "" && scope != "/" {
				n, err := d.CountStreamsUnder(ctx, "p", scope)
				require.NoError(t, err)
				want := 0
				for _, p := range paths {
					if under(p, scope) {
						want++
					}
				}
				if n != want {
					t.Errorf("CountStreamsUnder(%q): got %d, want %d", scope, n, want)
				}
			}
		}
	})

	// The index is read only over the paths a prefix and a scope allow: a prefix matching a few
	// streams of a project of 100,000 read all 100,000 before, for each page.
	t.Run("reads only the paths the prefix and scope allow", func(t *testing.T) {
		for _, c := range []struct{ scope, prefix, after string }{
			{"", "/in", ""}, {"", "/in/", "/in/x"}, {"/in", "", ""}, {"/in", "/in/x", "/in/x"}, {"/in", "/", ""},
		} {
			query, args := listStreamsQuery("p", c.scope, c.prefix, c.after, 10)
			plan := queryPlan(t, d, query, args)
			if !strings.Contains(plan, "(project_id=? AND path>? AND path<?)") {
				t.Errorf("scope %q prefix %q after %q: the plan %q does not seek both ends of the path range", c.scope, c.prefix, c.after, plan)
			}
		}
		plan := queryPlan(t, d, `select count(*) from streams where project_id = ? and path >= ? and path < ?`, []any{"p", "/in", "/in0"})
		require.Contains(t, plan, "path>? AND path<?", "the range CountStreamsUnder reads by")
	})
}

// queryPlan is SQLite's plan for query, its rows' details joined.
func queryPlan(t *testing.T, d *Directory, query string, args []any) string {
	t.Helper()
	rows, err := d.db.Query("explain query plan "+query, args...)
	require.NoError(t, err)
	defer rows.Close()
	var details []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
		details = append(details, detail)
	}
	require.NoError(t, rows.Err())
	return fmt.Sprint(details)
}
