package test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/processors"
	"github.com/itx-dev/itx/processors/remote"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

type tallied struct {
	N int `json:"n"`
}

const tallyAdded = processors.EventType[tallied]("tally/added")

// tallyCalls records, per reducer version, the offsets ProcessEvent ran on (eventless passes
// left out): what a vendor fake would have been asked to do.
type tallyCalls struct {
	mu sync.Mutex
	by map[string][]int64
}

func (c *tallyCalls) of(version string) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.by[version])
}

// tallyContract sums n under reducer version "1" and sums n*n under "2": a changed reducer whose
// state the old one's cannot be mistaken for.
func tallyContract(version string, calls *tallyCalls) func() processors.Contract[int] {
	return func() processors.Contract[int] {
		return processors.Contract[int]{
			Name: "tally", ConsumedTypes: []string{string(tallyAdded)}, ReducerVersion: version,
			InitialState: func() int { return 0 },
			Reduce: func(sum int, e itx.Event) int {
				p, err := tallyAdded.Decode(e)
				if err != nil {
					return sum
				}
				if version == "2" {
					return sum + p.N*p.N
				}
				return sum + p.N
			},
			ProcessEvent: func(_ context.Context, a *processors.Args[int]) error {
				if a.Event != nil {
					calls.mu.Lock()
					calls.by[version] = append(calls.by[version], a.Event.Offset)
					calls.mu.Unlock()
				}
				return nil
			},
		}
	}
}

// Seed 002: "A reducer-version change re-reduces from offset 0 with reduce only; it does not
// rerun processEvent. The processing cursor is separate and authoritative." A processor deployed
// again with a new ReducerVersion over a stream it has processed, in itxd (a restart on the new
// build) and on a remote host (the new build mounted), over real RPC: its snapshot is the new
// Reduce folded over the whole stream, getRuntimeState names the new version, and ProcessEvent
// runs under the new version only for the events appended after the deploy.
func TestSeedProc_NewReducerVersionReReducesWithoutProcessing(t *testing.T) {
	for _, placement := range []string{"in-process", "remote"} {
		t.Run(placement, func(t *testing.T) {
			calls := &tallyCalls{by: map[string][]int64{}}
			host := func(version string) *processors.Host {
				h := processors.NewHost("tally-build-" + version)
				require.NoError(t, processors.Add(h, tallyContract(version, calls)))
				return h
			}
			ctx := ctxT(t)
			cfg := server.Config{DataDir: t.TempDir()}
			if placement == "in-process" {
				cfg.Processors = host("1")
			}
			ts := startServer(t, cfg)
			var stopHost func()
			runHost := func(version string) {
				mounted := make(chan struct{}, 16)
				hctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					_ = remote.Run(hctx, remote.Config{Addr: ts.addr, Token: ts.creds.ProjectToken, Name: "tally-host", Host: host(version),
						MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
						Logf: t.Logf, Mounted: func() { mounted <- struct{}{} }})
				}()
				stopHost = func() { cancel(); <-done }
				t.Cleanup(stopHost)
				awaitMount(t, mounted)
			}

			const path = "/seedproc/tally"
			s := stream(t, ts.project(t), path)
			if placement == "remote" {
				configureRemote(t, s, "tally")
				runHost("1")
			} else {
				configureProcessor(t, s, "tally")
			}
			var before []int64
			for n := 1; n <= 4; n++ {
				before = append(before, mustAppend(t, s, tallyAdded.Input(tallied{N: n}, "")).Offsets[0])
			}
			sub, proc := processorOf(t, s, "tally")
			_, err := client.WaitUntilProcessed(ctx, sub, before[len(before)-1], 20*time.Second)
			require.NoError(t, err)
			snap, err := client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.Equal(t, "10", snap.State, "v1 sums n over 1..4")
			require.Equal(t, before, calls.of("1"), "v1 processed each event once")

			// The deploy of the new reducer.
			if placement == "in-process" {
				closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, ts.srv.Close(closeCtx))
				cfg.Processors = host("2")
				ts = startServer(t, cfg)
				s = stream(t, ts.project(t), path)
			} else {
				stopHost()
				runHost("2")
			}
			after := mustAppend(t, s, tallyAdded.Input(tallied{N: 5}, "")).Offsets[0]
			sub, proc = processorOf(t, s, "tally")
			_, err = client.WaitUntilProcessed(ctx, sub, after, 20*time.Second)
			require.NoError(t, err)

			snap, err = client.Snapshot(ctx, proc)
			require.NoError(t, err)
			require.Equal(t, "55", snap.State, "the snapshot is v2's Reduce (n*n) folded over the whole stream, 1..5")
			require.GreaterOrEqual(t, snap.ReducedOffset, after)
			require.Equal(t, snap.ReducedOffset, snap.ProcessedOffset)
			raw, err := client.RuntimeState(ctx, proc)
			require.NoError(t, err)
			var rs itx.ProcessorRuntimeState
			require.NoError(t, json.Unmarshal([]byte(raw), &rs), raw)
			require.Equal(t, "2", rs.ReducerVersion, raw)
			if got := calls.of("2"); !slices.Equal(got, []int64{after}) {
				t.Errorf("under v2 ProcessEvent ran on offsets %v, want only %d (the events v1 processed, %v, are re-reduced, never processed again)", got, after, before)
			}
			require.Equal(t, before, calls.of("1"), "v1 ran again after the deploy")
		})
	}
}
