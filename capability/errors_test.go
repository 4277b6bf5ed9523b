package capability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	"capnproto.org/go/capnp/v3/exc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/stretchr/testify/require"
)

// Every domain code must be an enumerant of schema ErrorCode, spelled the same: the code crosses
// the wire as that name.
func TestCodes_MatchSchema(t *testing.T) {
	for _, c := range itx.Codes {
		e := schema.ErrorCodeFromString(string(c))
		require.Equal(t, string(c), e.String(), "itx code %q has no schema ErrorCode", c)
	}
}

func TestFail(t *testing.T) {
	err := fail(itx.Errorf(itx.ERateLimited, "slow down"))
	require.Equal(t, exc.Overloaded, exc.TypeOf(err))
	require.Equal(t, "itx.rateLimited: slow down", err.Error())
	require.Equal(t, exc.Failed, exc.TypeOf(fail(itx.Errorf(itx.EInvalid, "x"))))
	require.Nil(t, fail(nil))
	// A directory write on a full disk carries no code of its own.
	require.Equal(t, "itx.resourceExhausted: create project: write x: no space left on device",
		fail(fmt.Errorf("create project: %w", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC})).Error())
	require.Equal(t, "itx.internal: disk on fire", fail(errors.New("disk on fire")).Error())
}

// Every exception a handler returns names an itx code in its reason, whatever made it.
func TestCoded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       error
		wantType exc.Type
		want     string
	}{
		{"made by fail", fail(itx.Errorf(itx.ERateLimited, "slow down")), exc.Overloaded, "itx.rateLimited: slow down"},
		{"not served yet", notYet("Stream.liveState"), exc.Unimplemented, "itx.unavailable: Stream.liveState is not implemented by this server"},
		{"a domain error without fail", fmt.Errorf("append: %w", itx.Errorf(itx.ETooLarge, "too big")), exc.Failed, "itx.tooLarge: too big"},
		{"an encoding failure", errors.New("capnp: message too large"), exc.Failed, "itx.internal: capnp: message too large"},
		{"an exception without a code", exc.New(exc.Disconnected, "", "connection lost"), exc.Disconnected, "itx.internal: connection lost"},
		{"a cancelled context", fmt.Errorf("read: %w", context.Canceled), exc.Failed, "itx.cancelled: the call was cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := coded(tc.in)
			require.Equal(t, tc.wantType, exc.TypeOf(got))
			require.Equal(t, tc.want, got.Error())
		})
	}
	require.Nil(t, coded(nil))
}
