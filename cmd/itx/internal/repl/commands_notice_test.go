package repl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A tail or watch that goes on after slowConsumer says the process fell behind: itxd did not go
// anywhere.
func TestWentAwayNotice(t *testing.T) {
	require.Equal(t, "itxd went away (serverShuttingDown)", wentAwayNotice("serverShuttingDown"))
	require.Equal(t, "itxd went away (connectionLost)", wentAwayNotice("connectionLost"))
	require.Equal(t, "itxd closed the connection because this process fell behind (slowConsumer)", wentAwayNotice("slowConsumer"))
}
