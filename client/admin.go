package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/wire"
)

// Admin returns project.admin() at once, pipelined (see Stream): the deployment root administers
// every project, a project token with the admin right its own project's tokens.
func Admin(ctx context.Context, project schema.Project) schema.Admin {
	fut, release := project.Admin(lasting(ctx), nil)
	return keepAnswers(fut.Admin().AddRef(), release)
}

// CreateProject creates a project and returns it with its first token (shown only now).
func CreateProject(ctx context.Context, a schema.Admin, name string) (itx.ProjectInfo, string, itx.TokenInfo, error) {
	if err := NotSent(ctx, "CreateProject"); err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	fut, release := a.CreateProject(ctx, func(p schema.Admin_createProject_Params) error { return p.SetName(name) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	info, err := res.Info()
	if err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	p, err := wire.ProjectInfoFromSchema(info)
	if err != nil {
		return p, "", itx.TokenInfo{}, err
	}
	token, err := res.Token()
	if err != nil {
		return p, "", itx.TokenInfo{}, err
	}
	ti, err := res.TokenInfo()
	if err != nil {
		return p, token, itx.TokenInfo{}, err
	}
	t, err := wire.TokenInfoFromSchema(ti)
	return p, token, t, err
}

// ListProjects lists the projects the caller administers, with their stream counts, every page
// of them (ListProjectsPage for one).
func ListProjects(ctx context.Context, a schema.Admin) ([]itx.ProjectSummary, error) {
	var all []itx.ProjectSummary
	after := ""
	for {
		page, next, err := ListProjectsPage(ctx, a, after, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		after = next
	}
}

// ListProjectsPage lists one page of projects in id order after the id after (limit 0: the
// server's default page); next is the id to pass as after for the next page, empty on the last.
func ListProjectsPage(ctx context.Context, a schema.Admin, after string, limit int) (page []itx.ProjectSummary, next string, err error) {
	if err := NotSent(ctx, "ListProjects"); err != nil {
		return nil, "", err
	}
	fut, release := a.ListProjects(ctx, func(p schema.Admin_listProjects_Params) error {
		p.SetLimit(limitArg(limit))
		return p.SetAfter(after)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, "", err
	}
	list, err := res.Projects()
	if err != nil {
		return nil, "", err
	}
	if page, err = fromList(list, wire.ProjectSummaryFromSchema); err != nil {
		return nil, "", err
	}
	next, err = res.NextAfter()
	return page, next, err
}

// RenameProject renames a project.
func RenameProject(ctx context.Context, a schema.Admin, projectID, name string) error {
	if err := NotSent(ctx, "RenameProject"); err != nil {
		return err
	}
	fut, release := a.RenameProject(ctx, func(p schema.Admin_renameProject_Params) error {
		if err := p.SetProjectId(projectID); err != nil {
			return err
		}
		return p.SetName(name)
	})
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// DeleteProject deletes a project; one with streams only with force (its streams go too).
func DeleteProject(ctx context.Context, a schema.Admin, projectID string, force bool) error {
	if err := NotSent(ctx, "DeleteProject"); err != nil {
		return err
	}
	fut, release := a.DeleteProject(ctx, func(p schema.Admin_deleteProject_Params) error {
		p.SetForce(force)
		return p.SetProjectId(projectID)
	})
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// TokenOptions describe a new token: its label, scope and optional expiry.
type TokenOptions struct {
	Label   string
	Scope   itx.Scope // zero: the whole project
	Expires time.Time // zero: never
}

// CreateToken creates another token for a project ("" is the caller's own) and returns it (shown
// only now) with its description.
func CreateToken(ctx context.Context, a schema.Admin, projectID string, o TokenOptions) (string, itx.TokenInfo, error) {
	// An unknown right has no enumerant to send: refuse it here, typed, before calling.
	if err := o.Scope.Validate(); err != nil {
		return "", itx.TokenInfo{}, err
	}
	if err := NotSent(ctx, "CreateToken"); err != nil {
		return "", itx.TokenInfo{}, err
	}
	fut, release := a.CreateToken(ctx, func(p schema.Admin_createToken_Params) error {
		if !o.Expires.IsZero() {
			p.SetExpiresAt(o.Expires.UnixMilli())
		}
		if err := p.SetProjectId(projectID); err != nil {
			return err
		}
		if err := p.SetLabel(o.Label); err != nil {
			return err
		}
		sc, err := p.NewScope()
		if err != nil {
			return err
		}
		return wire.SetScope(sc, o.Scope)
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return "", itx.TokenInfo{}, err
	}
	token, err := res.Token()
	if err != nil {
		return "", itx.TokenInfo{}, err
	}
	info, err := res.Info()
	if err != nil {
		return token, itx.TokenInfo{}, err
	}
	t, err := wire.TokenInfoFromSchema(info)
	return token, t, err
}

// ListTokens lists a project's tokens ("" is the caller's own project): never the tokens.
func ListTokens(ctx context.Context, a schema.Admin, projectID string) ([]itx.TokenInfo, error) {
	if err := NotSent(ctx, "ListTokens"); err != nil {
		return nil, err
	}
	fut, release := a.ListTokens(ctx, func(p schema.Admin_listTokens_Params) error { return p.SetProjectId(projectID) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return nil, err
	}
	list, err := res.Tokens()
	if err != nil {
		return nil, err
	}
	return fromList(list, wire.TokenInfoFromSchema)
}

// RevokeToken revokes a token at once ("" is the caller's own project).
func RevokeToken(ctx context.Context, a schema.Admin, projectID, tokenID string) error {
	if err := NotSent(ctx, "RevokeToken"); err != nil {
		return err
	}
	fut, release := a.RevokeToken(ctx, func(p schema.Admin_revokeToken_Params) error {
		if err := p.SetProjectId(projectID); err != nil {
			return err
		}
		return p.SetTokenId(tokenID)
	})
	defer ReleaseAfter(ctx, release)
	_, err := Await(ctx, fut)
	return err
}

// ReadOnly returns s.readOnly() at once, pipelined (see Stream): a capability to the same stream
// that only reads, to hand to someone else.
func ReadOnly(ctx context.Context, s schema.Stream) schema.Stream {
	fut, release := s.ReadOnly(lasting(ctx), nil)
	return keepAnswers(fut.Stream().AddRef(), release)
}

// AppendOnly returns s.appendOnly() at once, pipelined (see Stream): a capability to the same
// stream that only appends.
func AppendOnly(ctx context.Context, s schema.Stream) schema.Stream {
	fut, release := s.AppendOnly(lasting(ctx), nil)
	return keepAnswers(fut.Stream().AddRef(), release)
}

// BackupResult says what Backup wrote.
type BackupResult struct {
	Path    string
	Streams int           // stream databases copied
	Bytes   int64         // bytes of the database files written
	At      time.Time     // the instant the copy holds
	Frozen  time.Duration // how long appends to loaded streams waited for the instant
}

// Backup has itxd write a copy of its whole data directory, as it stood at one instant, to path
// (absolute, on the server's file system, not existing yet); the deployment root only. Start
// itxd with --data on the copy to restore it.
func Backup(ctx context.Context, a schema.Admin, path string) (BackupResult, error) {
	if err := NotSent(ctx, "Backup"); err != nil {
		return BackupResult{}, err
	}
	fut, release := a.Backup(ctx, func(p schema.Admin_backup_Params) error { return p.SetPath(path) })
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return BackupResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return BackupResult{}, err
	}
	p, err := r.Path()
	if err != nil {
		return BackupResult{}, err
	}
	return backupResultOf(r, p), nil
}

// backupResultOf is what r says a backup wrote, at path.
func backupResultOf(r schema.BackupResult, path string) BackupResult {
	return BackupResult{
		Path: path, Streams: int(r.Streams()), Bytes: int64(r.Bytes()),
		At: time.UnixMilli(r.At()).UTC(), Frozen: time.Duration(r.FrozenMicros()) * time.Microsecond,
	}
}

// DownloadBackup has itxd send a copy of its whole data directory, as it stood at one instant
// (the copy Backup writes), to dir on this machine: a new directory (it must not exist; its
// folder must), written beside it and renamed into place once every file is on disk, so a
// failed download leaves nothing at dir. itxd needs room for one copy in its data directory
// meanwhile. The deployment root only. Start itxd with --data on dir to restore it.
func DownloadBackup(ctx context.Context, a schema.Admin, dir string) (BackupResult, error) {
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); err == nil {
		return BackupResult{}, itx.Errorf(itx.EFailedPrecondition, "download: %s exists (a backup is a new directory)", dir)
	}
	if err := NotSent(ctx, "DownloadBackup"); err != nil {
		return BackupResult{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".itx-download-")
	if err != nil {
		return BackupResult{}, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Mkdir(filepath.Join(tmp, "streams"), 0o700); err != nil {
		return BackupResult{}, err
	}
	sink := &backupSink{dir: tmp, files: map[string]*os.File{}}
	defer sink.close()
	fut, release := a.Download(ctx, func(p schema.Admin_download_Params) error {
		return p.SetSink(schema.BackupSink_ServerToClient(sink))
	})
	defer ReleaseAfter(ctx, release)
	res, err := Await(ctx, fut)
	if err != nil {
		return BackupResult{}, err
	}
	r, err := res.Result()
	if err != nil {
		return BackupResult{}, err
	}
	if err := sink.finish(); err != nil {
		return BackupResult{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return BackupResult{}, err
	}
	done = true
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return BackupResult{}, err
	}
	return backupResultOf(r, dir), nil
}

// backupSink writes the files of a download under dir: only the names a data directory holds,
// each from offset 0 on, part after part.
type backupSink struct {
	mu    sync.Mutex
	dir   string
	files map[string]*os.File
	size  map[string]int64
	err   error
}

var streamFileName = regexp.MustCompile(`^streams/[A-Za-z0-9-]{1,64}\.db$`)

func (s *backupSink) Write(ctx context.Context, call schema.BackupSink_write) error {
	args := call.Args()
	path, err := args.Path()
	if err != nil {
		return err
	}
	data, err := args.Data()
	if err != nil {
		return err
	}
	return s.part(path, args.Offset(), data)
}

// part writes one part of a file of the download.
func (s *backupSink) part(path string, offset uint64, data []byte) error {
	var err error
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if path != "directory.db" && path != "credentials.json" && !streamFileName.MatchString(path) {
		s.err = itx.Errorf(itx.EInvalid, "download: itxd sent a file named %q, which no data directory holds", path)
		return s.err
	}
	if s.size == nil {
		s.size = map[string]int64{}
	}
	f := s.files[path]
	if f == nil {
		if offset != 0 {
			s.err = itx.Errorf(itx.EInvalid, "download: %s began at offset %d", path, offset)
			return s.err
		}
		if f, err = os.OpenFile(filepath.Join(s.dir, filepath.FromSlash(path)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			s.err = err
			return err
		}
		s.files[path] = f
	}
	if int64(offset) != s.size[path] {
		s.err = itx.Errorf(itx.EInvalid, "download: %s part at %d, want %d", path, offset, s.size[path])
		return s.err
	}
	if _, err := f.Write(data); err != nil {
		s.err = err
		return err
	}
	s.size[path] += int64(len(data))
	return nil
}

// finish syncs every file and the folders; the download holds a data directory's files.
func (s *backupSink) finish() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.files["directory.db"] == nil {
		return itx.Errorf(itx.EInternal, "download: itxd sent no directory.db")
	}
	for _, f := range s.files {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	for _, d := range []string{filepath.Join(s.dir, "streams"), s.dir} {
		if err := syncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func (s *backupSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.Close()
	}
	if s.err == nil {
		s.err = errors.New("download: closed")
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
