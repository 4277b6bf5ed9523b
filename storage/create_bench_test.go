package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkCreateStream: making a new stream's database (its schema and its meta row), on the
// disk the test's temporary directory is on: a creation's cost is mostly its commits' fsyncs.
func BenchmarkCreateStream(b *testing.B) {
	dir := b.TempDir()
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		s, err := CreateStream(ctx, filepath.Join(dir, fmt.Sprintf("%d.db", i)), StreamMeta{StreamID: fmt.Sprint(i), ProjectID: "p", Path: fmt.Sprintf("/s/%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
