package remote

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/processors"
)

// A host without a version is refused before dialing, rather than failing every wake.
func TestRun_HostNeedsAVersion(t *testing.T) {
	h := processors.NewHost("")
	if err := processors.Add(h, func() processors.Contract[int] {
		return processors.Contract[int]{Name: "p", ConsumedTypes: []string{"x"}, ReducerVersion: "1",
			InitialState: func() int { return 0 }, Reduce: func(n int, e itx.Event) int { return n }}
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := Run(ctx, Config{Addr: "127.0.0.1:1", Token: "t", Name: "n", Host: h})
	if itx.ErrorCode(err) != itx.EInvalid || !strings.Contains(err.Error(), "the host has no version") {
		t.Fatalf("got %v, want the missing version refused", err)
	}
}
