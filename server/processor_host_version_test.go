package server

import (
	"context"
	"strings"
	"testing"

	"github.com/itx-dev/itx"
)

// versionlessHost is a processor host whose Version is empty.
type versionlessHost struct{ itx.ProcessorHost }

func (versionlessHost) Version() string { return "" }

// A processor host without a version is refused when the server opens, rather than failing
// every processor-wake subscription's wakes (an outage the ladder retries for two hours) with
// "processor registry needs the host version".
func TestOpen_ProcessorHostNeedsAVersion(t *testing.T) {
	_, err := Open(context.Background(), Config{DataDir: t.TempDir(), Processors: versionlessHost{}})
	if err == nil || !strings.Contains(err.Error(), "the processor host has no version") {
		t.Fatalf("got %v, want the missing version refused", err)
	}
}
