package client

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// The download's sink writes only a data directory's files, each in order from offset 0; the
// first refusal ends it.
func TestBackupSink_Parts(t *testing.T) {
	newSink := func() *backupSink {
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "streams"), 0o700))
		return &backupSink{dir: dir, files: map[string]*os.File{}}
	}
	s := newSink()
	require.NoError(t, s.part("directory.db", 0, []byte("ab")))
	require.NoError(t, s.part("directory.db", 2, []byte("cd")))
	require.NoError(t, s.part("streams/0b6f-11.db", 0, []byte("x")))
	require.NoError(t, s.finish())
	b, err := os.ReadFile(filepath.Join(s.dir, "directory.db"))
	require.NoError(t, err)
	require.Equal(t, "abcd", string(b))
	s.close()

	for _, c := range []struct {
		path   string
		offset uint64
	}{
		{"../x.db", 0}, {"streams/../../x.db", 0}, {"/etc/passwd", 0}, {"streams/a/b.db", 0},
		{"other.txt", 0}, {"directory.db", 5},
	} {
		s := newSink()
		err := s.part(c.path, c.offset, []byte("x"))
		require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%s at %d: %v", c.path, c.offset, err)
		require.Error(t, s.part("directory.db", 0, []byte("x")), "a refused download takes nothing more")
		s.close()
	}
	s = newSink()
	require.NoError(t, s.part("directory.db", 0, []byte("ab")))
	require.Equal(t, itx.EInvalid, itx.ErrorCode(s.part("directory.db", 1, []byte("b"))))
	s.close()
	_, err = os.Stat(filepath.Join(filepath.Dir(s.dir), "x.db"))
	require.True(t, os.IsNotExist(err))
}
