package repl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// fitColumns narrows the widest columns first, down to minColumnWidth, then leaves out the last
// columns, keeping at least one.
func TestFitColumns(t *testing.T) {
	widths := []int{12, 4, 9}
	require.Equal(t, 3, fitColumns(widths, 23))
	require.Equal(t, []int{7, 4, 8}, widths, "the widest narrowed first, one at a time (the first of equals)")

	widths = []int{10, 10, 10, 10}
	require.Equal(t, 2, fitColumns(widths, 20), "at 6 each four need 30 and three 22: two stay")
	require.Equal(t, []int{6, 6}, widths[:2])

	widths = []int{30}
	require.Equal(t, 1, fitColumns(widths, 3), "one column always stays")
	require.Equal(t, []int{minColumnWidth}, widths)

	widths = []int{3, 4}
	require.Equal(t, 2, fitColumns(widths, 80), "a row that fits is left alone")
	require.Equal(t, []int{3, 4}, widths)
}
