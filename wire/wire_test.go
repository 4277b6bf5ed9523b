package wire

import (
	"encoding/json"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

func mustSegment(tb testing.TB) *capnp.Segment {
	tb.Helper()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(tb, err)
	return seg
}

// roundTrip encodes v into a new root struct made by newRoot and decodes it back.
func roundTrip[T, S any](t *testing.T, v T, newRoot func(*capnp.Segment) (S, error), set func(S, T) error, get func(S) (T, error)) T {
	t.Helper()
	dst, err := newRoot(mustSegment(t))
	require.NoError(t, err)
	require.NoError(t, set(dst, v))
	got, err := get(dst)
	require.NoError(t, err)
	return got
}

// Every vocabulary type survives the trip through its Cap'n Proto struct: the server encodes and
// the client decodes with these same functions.
func TestWire_RoundTrip(t *testing.T) {
	events := []itx.Event{
		{Offset: 4, Type: "note", Payload: json.RawMessage(`{"n":1}`), CreatedAt: 1000},
		{Offset: 5, Type: "copy", Payload: json.RawMessage(`{}`), CreatedAt: 1001, IdempotencyKey: "k",
			Metadata: json.RawMessage(`{"m":true}`), Provenance: []itx.Hop{{StreamID: "s", Path: "/a", Offset: 2, Subscription: "c", CursorChangedAtOffset: 1, Type: "note"}}},
	}
	t.Run("AppendOptions", func(t *testing.T) {
		want := itx.AppendOptions{Conditional: true, ExpectedHeadOffset: 7}
		got := roundTrip(t, want, schema.NewRootAppendOptions,
			func(d schema.AppendOptions, v itx.AppendOptions) error { SetAppendOptions(d, v); return nil },
			func(s schema.AppendOptions) (itx.AppendOptions, error) { return AppendOptionsFromSchema(s), nil })
		require.Equal(t, want, got)
	})
	t.Run("AppendResult", func(t *testing.T) {
		want := itx.AppendResult{Offsets: []int64{3, 4}, Duplicate: []bool{false, true}, HeadOffset: 4, StreamID: "sid"}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootAppendResult, SetAppendResult, AppendResultFromSchema))
	})
	t.Run("Query", func(t *testing.T) {
		want := itx.Query{After: 1, Before: 9, Limit: 10, Types: []string{"a", "b"}, IncludeEphemeral: true}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootEventQuery, SetQuery, QueryFromSchema))
	})
	t.Run("Page", func(t *testing.T) {
		want := itx.Page{Events: events, StreamID: "sid", StreamMaxOffset: 9, NextAfter: 5}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootEventPage, SetPage, PageFromSchema))
	})
	t.Run("Predicate", func(t *testing.T) {
		want := itx.Predicate{Types: []string{"order"}, PayloadContains: json.RawMessage(`{"a":1}`), Where: "payload.a = 1", IncludeEphemeral: true}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootEventPredicate, SetPredicate, PredicateFromSchema))
	})
	t.Run("StreamDiskUsage", func(t *testing.T) {
		want := itx.StreamDiskUsage{Path: "/a", StreamID: "sid", DiskBytes: 1 << 40, HeadOffset: 9}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootStreamDiskUsage, SetStreamDiskUsage, StreamDiskUsageFromSchema))
	})
	t.Run("StreamInfo", func(t *testing.T) {
		want := itx.StreamInfo{Path: "/a", StreamID: "sid", HeadOffset: 3, CreatedAt: 10, LastAppendAt: 20, SubscriptionCount: 2, Loaded: true}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootStreamInfo, SetStreamInfo, StreamInfoFromSchema))
	})
	t.Run("ProjectInfo", func(t *testing.T) {
		want := itx.ProjectInfo{ID: "p1", Name: "default", Deployment: true}
		require.Equal(t, want, roundTrip(t, want, schema.NewRootProjectInfo, SetProjectInfo, ProjectInfoFromSchema))
	})
	t.Run("MountInfo", func(t *testing.T) {
		want := []itx.MountInfo{{Name: "inbox", MountedAt: 5}, {Name: "other", MountedAt: 6, Scope: "/tenant/"}}
		seg := mustSegment(t)
		var list schema.MountInfo_List
		require.NoError(t, SetMountInfos(want, func(n int32) (schema.MountInfo_List, error) {
			var err error
			list, err = schema.NewMountInfo_List(seg, n)
			return list, err
		}))
		got, err := MountInfosFromSchema(list)
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
	t.Run("ReaderInfo", func(t *testing.T) {
		want := []itx.ReaderInfo{{Name: "indexer", Checkpoint: 5, Lag: 2, UpdatedAt: 7}}
		seg := mustSegment(t)
		var list schema.ReaderInfo_List
		require.NoError(t, SetReaderInfos(want, func(n int32) (schema.ReaderInfo_List, error) {
			var err error
			list, err = schema.NewReaderInfo_List(seg, n)
			return list, err
		}))
		got, err := ReaderInfosFromSchema(list)
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
	t.Run("SubscriptionSummary", func(t *testing.T) {
		for _, status := range []string{itx.StatusActive, itx.StatusHalted, itx.StatusParked} {
			want := itx.SubscriptionSummary{Name: "s", Kind: itx.KindITXCall, Status: status, ConfirmedOffset: 3, Lag: 2, LastError: "e", ConfiguredAtOffset: 1}
			require.Equal(t, want, roundTrip(t, want, schema.NewRootSubscriptionSummary, SetSubscriptionSummary, SubscriptionSummaryFromSchema))
		}
	})
	t.Run("SubscriptionDescription", func(t *testing.T) {
		want := itx.SubscriptionDescription{
			Config: itx.SubscriptionConfig{Name: "copy", Description: "d",
				Filter: &itx.SubscriptionFilter{EventTypes: []string{"note"}, JSONataCondition: "true"},
				Receiver: itx.Receiver{Action: itx.KindCopyToStream, ReceivingStreamPath: "/b", JSONataTransform: "$",
					Delivery: &itx.DeliveryPolicy{Start: itx.StartNow, OnFailingEvent: itx.OnFailingHalt}}},
			Kind: itx.KindCopyToStream, HeadOffset: 9, SecretSet: true,
			CursorState: itx.CursorState{Status: itx.StatusHalted, ConfiguredAtOffset: 1, CursorChangedAtOffset: 2, ConfirmedOffset: 3,
				Attempt: 4, NextAttemptAt: 5, FailingEventOffset: 6, FailingEventAttempt: 7, FailingEventSkips: 8, LastError: "boom",
				InFlightDeadlineAt: 10, InFlightConnectionGeneration: 11, UpdatedAt: "2026-12-01T00:00:00Z"},
		}
		got := roundTrip(t, want, schema.NewRootSubscriptionDescription,
			func(d schema.SubscriptionDescription, v itx.SubscriptionDescription) error {
				return SetSubscriptionDescription(d, &v)
			},
			SubscriptionDescriptionFromSchema)
		require.Equal(t, want, got)

		none := itx.SubscriptionDescription{Config: want.Config, Kind: want.Kind} // no cursor row yet
		got = roundTrip(t, none, schema.NewRootSubscriptionDescription,
			func(d schema.SubscriptionDescription, v itx.SubscriptionDescription) error {
				return SetSubscriptionDescription(d, &v)
			},
			SubscriptionDescriptionFromSchema)
		require.Equal(t, itx.StatusActive, got.Status)
	})
	t.Run("DeliveryBatch", func(t *testing.T) {
		want := itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{StreamID: "sid", Path: "/a", Subscription: "s",
			ConfiguredAtOffset: 1, CursorChangedAtOffset: 2, DeliveryID: "d", Attempt: 3, HeadOffset: 9}, Events: events}
		got := roundTrip(t, want, schema.NewRootDeliveryBatch,
			func(d schema.DeliveryBatch, v itx.DeliveryBatch) error { return SetDeliveryBatch(d, &v) },
			DeliveryBatchFromSchema)
		require.Equal(t, want, got)
	})
}

// Every itx status is a SubscriptionStatus enumerant of the same name: it crosses the wire as
// that name.
func TestStatuses_MatchSchema(t *testing.T) {
	for _, s := range []string{itx.StatusActive, itx.StatusHalted, itx.StatusParked} {
		require.Equal(t, s, schema.SubscriptionStatusFromString(s).String())
	}
}
