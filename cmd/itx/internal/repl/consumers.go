package repl

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

func init() {
	register(&Command{Name: "consumers", Args: "[prefix] [--behind]", CLI: true,
		Help: "where every consumer stands: each subscription and registered reader of the streams under prefix (default: all) with its confirmed and delivered offsets (apart only while an offset-acking receiver holds events unconfirmed) and its lag, a stream itxd cannot serve (its database lost or damaged) first as one row with status unavailable, then halted and parked ones; --behind shows only those with lag or not active",
		Run:  runConsumers,
		Check: func(args []string) error {
			_, err := parseConsumers(args)
			return err
		}})
}

type consumersArgs struct {
	prefix string
	behind bool
}

func parseConsumers(args []string) (consumersArgs, error) {
	var a consumersArgs
	prefixed := false
	for _, arg := range args {
		switch {
		case arg == "--behind":
			a.behind = true
		case strings.HasPrefix(arg, "-"):
			return a, usageError("consumers", "unknown flag %q", arg)
		case prefixed:
			return a, usageError("consumers", "too many arguments")
		default:
			if err := itx.ValidatePathPrefix(arg); err != nil {
				return a, usageError("consumers", "%s", itx.ErrorMessage(err))
			}
			a.prefix, prefixed = arg, true
		}
	}
	return a, nil
}

// consumerRowJS is one consumer of one stream, as .consumers prints it.
type consumerRowJS struct {
	Path          string `json:"path"`
	Name          string `json:"name"`
	Kind          string `json:"kind"`
	Status        string `json:"status"`
	Confirmed     int64  `json:"confirmed"`
	Delivered     int64  `json:"delivered"` // ahead of confirmed by what an offset-acking receiver took and has not confirmed
	Head          int64  `json:"head"`
	Lag           int64  `json:"lag"`
	LastError     string `json:"lastError"`
	Attempt       int    `json:"attempt"` // the retry ladder's rung (0: none), as subscriptions.list() shows it
	NextAttemptAt msTime `json:"nextAttemptAt"`
}

// statusUnavailable is the status of a row standing for a stream whose consumers could not be
// read: its database lost or damaged (StreamInfo.Unavailable), or its listing failed.
const statusUnavailable = "unavailable"

// statusRank orders the statuses that need a person first.
func statusRank(status string) int {
	switch status {
	case statusUnavailable:
		return 0
	case itx.StatusHalted:
		return 1
	case itx.StatusParked:
		return 2
	}
	return 3
}

// runConsumers lists the subscriptions and registered readers of every stream under a prefix
// whose summary shows any (Streams.list: subscriptionCount, readerCount), read
// from each stream's subscriptions.list().
// consumersInFlight bounds the listings itx consumers has unanswered at once.
const consumersInFlight = 16

func runConsumers(ctx context.Context, s *Session, args []string) error {
	a, err := parseConsumers(args)
	if err != nil {
		return err
	}
	streams, err := client.ListStreams(ctx, s.project, a.prefix)
	if err != nil {
		return err
	}
	var wanted []itx.StreamInfo
	for _, info := range streams {
		if info.SubscriptionCount == 0 && info.Readers == 0 {
			continue // no consumer
		}
		if a.behind && info.HaltedSubscriptions == 0 && info.ParkedSubscriptions == 0 && info.MaxLag == 0 && info.Unavailable == "" {
			continue // every consumer caught up, none halted or parked (live for a loaded stream)
		}
		wanted = append(wanted, info)
	}
	// The streams' listings are read consumersInFlight at a time over the one connection, so a
	// project of many streams answers in a few round trips' time, not one per stream.
	lists := make([][]itx.SubscriptionSummary, len(wanted))
	errs := make([]error, len(wanted))
	sem := make(chan struct{}, consumersInFlight)
	var wg sync.WaitGroup
	for i, info := range wanted {
		wg.Add(1)
		sem <- struct{}{}
		c := s.client(streamPath(info.Path)) // here: the session's capability cache is not shared
		go func() {
			defer func() { <-sem; wg.Done() }()
			subs := client.Subscriptions(ctx, schema.Stream(c))
			lists[i], errs[i] = client.ListSubscriptions(ctx, subs)
			subs.Release()
			c.Release()
		}()
	}
	wg.Wait()
	rows := []consumerRowJS{}
	for i, info := range wanted {
		if errs[i] != nil {
			if itx.ErrorCode(errs[i]) != itx.EUnavailable {
				return fmt.Errorf("%s: %w", info.Path, errs[i])
			}
			// The stream cannot be served (its database lost or damaged): one row says so, with
			// the head and consumers its summary last recorded, and the others are listed.
			rows = append(rows, consumerRowJS{Path: info.Path, Name: "-", Kind: "stream", Status: statusUnavailable,
				Head: info.HeadOffset, Lag: info.MaxLag, LastError: itx.ErrorMessage(errs[i])})
			continue
		}
		for _, r := range lists[i] {
			if a.behind && r.Lag == 0 && r.Status == itx.StatusActive {
				continue
			}
			rows = append(rows, consumerRowJS{Path: info.Path, Name: r.Name, Kind: r.Kind, Status: r.Status,
				Confirmed: r.ConfirmedOffset, Delivered: max(r.DeliveredOffset, r.ConfirmedOffset), Head: r.ConfirmedOffset + r.Lag, Lag: r.Lag, LastError: r.LastError,
				Attempt: r.Attempt, NextAttemptAt: msTime(r.NextAttemptAt)})
		}
	}
	read := len(wanted)
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if ra, rb := statusRank(a.Status), statusRank(b.Status); ra != rb {
			return ra < rb
		}
		if a.Lag != b.Lag {
			return a.Lag > b.Lag
		}
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		return a.Name < b.Name
	})
	s.Print(s.toJS(rows))
	if s.cfg.Format != FormatJSON {
		s.note("%s on %s", plural(len(rows), "consumer"), plural(read, "stream"))
	}
	return nil
}
