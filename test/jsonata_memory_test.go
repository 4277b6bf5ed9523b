package test

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/stretchr/testify/require"
)

// TestItxd_JSONataMemoryIsBounded: a where that builds 2.5 billion items in 50,000 ranges
// (566 MiB before its time limit ended it, 1.26 GiB for eight at once) stops at the evaluation's
// total budget, answered invalidArgument, with less than 96 MiB of extra peak RSS in itxd; eight at once run one per core.
// One evaluation within its budget (500,000 items) adds about 15 MiB on a quiet machine; on a loaded one
// the collector's marking lags the allocation and a run once peaked at 64.66 MiB, so the bound
// allows that headroom while staying far under the unbounded 566 MiB.
func TestItxd_JSONataMemoryIsBounded(t *testing.T) {
	skipRSSUnderRace(t)
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc")
	}
	p := startItxd(t, t.TempDir())
	ctx := ctxT(t)
	conn := dial(t, p.addr)
	proj := conn.Login(ctx, p.creds.ProjectToken)
	defer proj.Release()
	s := stream(t, proj, "/where")
	mustAppend(t, s, ev("x", `{}`))
	pid := p.cmd.Process.Pid
	before := procStatusMiB(t, pid, "VmHWM")

	const where = `$map([1..50000], function($v){[1..50000]})`
	run := func() error {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{Where: where}, 0, time.Second)
		return err
	}
	err := run()
	requireCode(t, err, itx.EInvalid)
	require.Contains(t, itx.ErrorMessage(err), "total items")
	one := procStatusMiB(t, pid, "VmHWM")

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = run() }()
	}
	wg.Wait()
	for _, err := range errs {
		requireCode(t, err, itx.EInvalid)
	}
	eight := procStatusMiB(t, pid, "VmHWM")
	t.Logf("itxd peak RSS %.0f MiB before, %.0f after one evaluation, %.0f after eight at once", before, one, eight)
	require.Less(t, one-before, 96.0, "extra peak RSS of one evaluation (MiB)")
	// At most one evaluation per core runs at once (itxd runs on this machine's cores).
	require.Less(t, eight-before, 32.0*float64(max(2, runtime.NumCPU())), "extra peak RSS of eight at once (MiB)")
}
