package capability

import (
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
}
