package server

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// BackupChunk is the most of a file Download sends in one part.
const BackupChunk = 1 << 20

// downloadPrefix names the scratch folders of downloads in the data directory; one a crash left
// is removed at the next start.
const downloadPrefix = ".itx-download-"

// DownloadLabel is what the audit record of a downloaded backup names as its path.
const DownloadLabel = "(downloaded)"

// Download makes the same copy as Backup in a scratch folder of the data directory, sends its
// files to send (path relative to the copy, offset, data), one after another, each in parts of
// at most BackupChunk in order, and deletes the scratch folder. The copy counts as written (and
// is audited) once every part was accepted; a failure of send ends it.
func (s *Server) Download(ctx context.Context, by Admin, send func(path string, offset int64, data []byte) error) (res BackupResult, err error) {
	defer func() { s.countBackup(res, err) }()
	// In flight until it ends, as a backup is: a shutdown stops the sending, and waits for a
	// download whose parts were all accepted to keep its audit record (in the directory, which
	// it closes only after).
	if err := s.enterInflight(); err != nil {
		return BackupResult{}, err
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.base, cancel)()
	scratch, err := os.MkdirTemp(s.cfg.DataDir, downloadPrefix)
	if err != nil {
		return BackupResult{}, itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
	}
	defer os.RemoveAll(scratch)
	dest := filepath.Join(scratch, "copy")
	res, err = s.backupTo(ctx, by, scratch, dest, "")
	if err != nil {
		return BackupResult{}, err
	}
	files := []string{"directory.db"}
	if _, err := os.Stat(filepath.Join(dest, CredentialsFile)); err == nil {
		files = append(files, CredentialsFile)
	}
	entries, err := os.ReadDir(filepath.Join(dest, "streams"))
	if err != nil {
		return BackupResult{}, itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
	}
	var streams []string
	for _, e := range entries {
		streams = append(streams, "streams/"+e.Name())
	}
	sort.Strings(streams)
	buf := make([]byte, BackupChunk)
	for _, name := range append(files, streams...) {
		if err := sendFile(ctx, filepath.Join(dest, filepath.FromSlash(name)), name, buf, send); err != nil {
			if ctx.Err() != nil {
				return BackupResult{}, s.backupCancelled(ctx)
			}
			return BackupResult{}, err
		}
	}
	res.Path = ""
	s.auditBackup(by, DownloadLabel, res) // once the caller has every part
	return res, nil
}

func sendFile(ctx context.Context, file, name string, buf []byte, send func(string, int64, []byte) error) error {
	f, err := os.Open(file)
	if err != nil {
		return itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
	}
	defer f.Close()
	for off := int64(0); ; {
		n, err := io.ReadFull(f, buf)
		if n > 0 || off == 0 { // an empty file still goes, as one empty part
			if ctx.Err() != nil {
				return itx.Errorf(itx.ECancelled, "backup: %v", ctx.Err())
			}
			if serr := send(name, off, buf[:n]); serr != nil {
				if ctx.Err() != nil {
					return itx.Errorf(itx.ECancelled, "backup: %v", ctx.Err())
				}
				return serr
			}
			off += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return itx.Errorf(storage.ErrorCode(err), "backup: %v", err)
		}
	}
}

// removeDownloadScratch removes what downloads a crash cut short left in the data directory.
func removeDownloadScratch(dataDir string) {
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), downloadPrefix) {
			os.RemoveAll(filepath.Join(dataDir, e.Name()))
		}
	}
}
