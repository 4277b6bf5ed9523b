package proctest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/internal/clocktest"
)

// Under Config.PartitionSeed the runner's reads take 1 to PageSize events, varying from read to
// read, and still cover the stream in order; without it, every read takes the page it asks for.
func TestFencedLog_RandomPages(t *testing.T) {
	ctx := context.Background()
	stream := NewMemoryStream("/p", clocktest.New(time.Unix(0, 0)))
	var in []itx.EventInput
	for range 200 {
		in = append(in, itx.EventInput{Type: "x"})
	}
	if _, err := stream.Append(ctx, in); err != nil {
		t.Fatal(err)
	}
	read := func(pages *partition) []int {
		log := fencedLog{f: &fence{}, log: stream, pages: pages}
		var sizes []int
		for after := int64(0); after < stream.Head(); {
			page, err := log.Read(ctx, after, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Events) == 0 || page.Events[0].Offset != after+1 {
				t.Fatalf("read after %d: %d events from %v", after, len(page.Events), page.Events)
			}
			sizes = append(sizes, len(page.Events))
			after = page.ScannedThrough
		}
		return sizes
	}
	seen := map[int]bool{}
	for _, n := range read(&partition{rng: rand.New(rand.NewPCG(1, 0))}) {
		if n < 1 || n > 7 {
			t.Fatalf("a page of %d events, asked for 7", n)
		}
		seen[n] = true
	}
	if len(seen) != 7 {
		t.Errorf("random pages took the sizes %v, want every one of 1..7 over 200 events", seen)
	}
	for _, n := range read(nil)[:28] {
		if n != 7 {
			t.Fatalf("without a seed a page of %d events, asked for 7", n)
		}
	}
}
