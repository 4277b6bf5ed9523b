package capability

import (
	"context"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/itx-dev/itx/wire"
)

// Admin is served to a session with the admin right: from the deployment root it reaches every
// project; from a project it reaches only that project's tokens.
func (p *project) Admin(ctx context.Context, call schema.Project_admin) error {
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	impl := &admin{srv: p.srv, p: p.p, acc: p.acc}
	return res.SetAdmin(schema.Admin(guarded(guardOf(p.srv), impl.acc, schema.Admin_Methods(nil, impl), impl)))
}

type admin struct {
	srv *server.Server
	p   itx.ProjectInfo // the project logged into
	acc access
}

func (a *admin) by() server.Admin {
	return server.Admin{TokenID: a.acc.session.Token.ID, ProjectID: a.p.ID}
}

// root reports whether this admin administers every project: a deployment token without a
// path prefix. A deployment token limited to a prefix is a project admin of the deployment
// project like any other: another project reaches streams outside its prefix.
func (a *admin) root() bool {
	return a.p.Deployment && (a.acc.prefix == "" || a.acc.prefix == "/")
}

// deployment refuses what only the deployment root may do.
func (a *admin) deployment(what string) error {
	if !a.p.Deployment {
		return itx.Errorf(itx.EPermissionDenied, "%s needs the deployment root's token", what)
	}
	if !a.root() {
		return itx.Errorf(itx.EPermissionDenied, "%s reaches every project: this token is limited to streams under %s", what, a.acc.prefix)
	}
	return nil
}

// project resolves the project a token call is about: empty means the caller's own; another
// project needs the deployment root.
func (a *admin) project(id string) (string, error) {
	if id == "" || id == a.p.ID {
		return a.p.ID, nil
	}
	if err := a.deployment("administering another project"); err != nil {
		return "", err
	}
	return id, nil
}

func (a *admin) CreateProject(ctx context.Context, call schema.Admin_createProject) error {
	if err := a.deployment("createProject"); err != nil {
		return fail(err)
	}
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	call.Go()
	info, token, tinfo, err := a.srv.CreateProject(ctx, a.by(), name)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	pi, err := res.NewInfo()
	if err != nil {
		return err
	}
	if err := wire.SetProjectInfo(pi, info); err != nil {
		return err
	}
	ti, err := res.NewTokenInfo()
	if err != nil {
		return err
	}
	if err := wire.SetTokenInfo(ti, tinfo); err != nil {
		return err
	}
	return res.SetToken(token)
}

func (a *admin) ListProjects(ctx context.Context, call schema.Admin_listProjects) error {
	after, err := call.Args().After()
	if err != nil {
		return badArgs("after", err)
	}
	// Checked here: a project's own admin is answered below without the server's listing.
	limit, err := server.ListLimit(int(call.Args().Limit()), server.DefaultListProjects, server.MaxListProjects)
	if err != nil {
		return fail(err)
	}
	call.Go()
	var list []itx.ProjectSummary
	var next string
	if a.root() {
		if list, next, err = a.srv.ListProjects(ctx, after, limit); err != nil {
			return fail(err)
		}
	} else if after < a.p.ID { // a project's admin sees its own project only
		own, err := a.srv.ProjectSummary(ctx, a.p.ID)
		if err != nil {
			return fail(err)
		}
		list = []itx.ProjectSummary{own}
	}
	if a.acc.prefix != "" && a.acc.prefix != "/" {
		// A token limited to a prefix counts the streams it can list, never the others.
		for i := range list {
			if list[i].StreamCount, err = a.srv.CountStreamsUnder(ctx, a.p.ID, a.acc.prefix); err != nil {
				return fail(err)
			}
		}
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	out, err := res.NewProjects(int32(len(list)))
	if err != nil {
		return err
	}
	for i, p := range list {
		if err := wire.SetProjectSummary(out.At(i), p); err != nil {
			return err
		}
	}
	return res.SetNextAfter(next)
}

func (a *admin) RenameProject(ctx context.Context, call schema.Admin_renameProject) error {
	if err := a.deployment("renameProject"); err != nil {
		return fail(err)
	}
	id, err := call.Args().ProjectId()
	if err != nil {
		return badArgs("projectId", err)
	}
	name, err := call.Args().Name()
	if err != nil {
		return badArgs("name", err)
	}
	call.Go()
	return fail(a.srv.RenameProject(ctx, a.by(), id, name))
}

func (a *admin) DeleteProject(ctx context.Context, call schema.Admin_deleteProject) error {
	if err := a.deployment("deleteProject"); err != nil {
		return fail(err)
	}
	id, err := call.Args().ProjectId()
	if err != nil {
		return badArgs("projectId", err)
	}
	call.Go()
	return fail(a.srv.DeleteProject(ctx, a.by(), id, call.Args().Force()))
}

func (a *admin) CreateToken(ctx context.Context, call schema.Admin_createToken) error {
	args := call.Args()
	id, err := args.ProjectId()
	if err != nil {
		return badArgs("projectId", err)
	}
	if id, err = a.project(id); err != nil {
		return fail(err)
	}
	label, err := args.Label()
	if err != nil {
		return badArgs("label", err)
	}
	var scope itx.Scope
	if args.HasScope() {
		sc, err := args.Scope()
		if err != nil {
			return badArgs("scope", err)
		}
		if scope, err = wire.ScopeFromSchema(sc); err != nil {
			return badArgs("scope", err)
		}
	}
	if err := scope.Validate(); err != nil {
		return fail(err)
	}
	// A token made for one's own project never carries more than the caller's own scope.
	if id == a.p.ID && !scope.Within(a.acc.scope()) {
		return fail(itx.Errorf(itx.EPermissionDenied, "the new token's scope must fit inside this token's (prefix %q, rights %v)", a.acc.prefix, a.acc.rights.names()))
	}
	// Nor does it outlive the caller's token: a token made by one that expires expires no later.
	expiresAt := args.ExpiresAt()
	if x := a.acc.session; x != nil && x.Token.ExpiresAt != 0 && (expiresAt == 0 || expiresAt > x.Token.ExpiresAt) {
		return fail(itx.Errorf(itx.EPermissionDenied, "this token expires at %d: a token it creates must expire by then (expiresAt %d)", x.Token.ExpiresAt, expiresAt))
	}
	call.Go()
	token, info, err := a.srv.CreateToken(ctx, a.by(), id, label, expiresAt, scope)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	ti, err := res.NewInfo()
	if err != nil {
		return err
	}
	if err := wire.SetTokenInfo(ti, info); err != nil {
		return err
	}
	return res.SetToken(token)
}

func (a *admin) ListTokens(ctx context.Context, call schema.Admin_listTokens) error {
	id, err := call.Args().ProjectId()
	if err != nil {
		return badArgs("projectId", err)
	}
	if id, err = a.project(id); err != nil {
		return fail(err)
	}
	call.Go()
	list, err := a.srv.ListTokens(ctx, id)
	if err != nil {
		return fail(err)
	}
	if id == a.p.ID {
		// A scoped admin sees the tokens it could have made (and may revoke), not the rest.
		kept := list[:0]
		for _, t := range list {
			if t.Scope.Within(a.acc.scope()) {
				kept = append(kept, t)
			}
		}
		list = kept
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	out, err := res.NewTokens(int32(len(list)))
	if err != nil {
		return err
	}
	for i, t := range list {
		if err := wire.SetTokenInfo(out.At(i), t); err != nil {
			return err
		}
	}
	return nil
}

func (a *admin) RevokeToken(ctx context.Context, call schema.Admin_revokeToken) error {
	id, err := call.Args().ProjectId()
	if err != nil {
		return badArgs("projectId", err)
	}
	if id, err = a.project(id); err != nil {
		return fail(err)
	}
	tokenID, err := call.Args().TokenId()
	if err != nil {
		return badArgs("tokenId", err)
	}
	call.Go()
	// A scoped admin revokes only tokens inside its own scope: never a wider one (the project's
	// whole-project token among them).
	if id == a.p.ID && !a.acc.scope().Whole() {
		list, err := a.srv.ListTokens(ctx, id)
		if err != nil {
			return fail(err)
		}
		for _, t := range list {
			if t.ID == tokenID && !t.Scope.Within(a.acc.scope()) {
				return fail(itx.Errorf(itx.EPermissionDenied, "token %s reaches more than this token: only a wider admin may revoke it", tokenID))
			}
		}
	}
	return fail(a.srv.RevokeToken(ctx, a.by(), id, tokenID))
}

func (a *admin) Backup(ctx context.Context, call schema.Admin_backup) error {
	if err := a.deployment("backup"); err != nil {
		return fail(err)
	}
	path, err := call.Args().Path()
	if err != nil {
		return badArgs("path", err)
	}
	call.Go()
	out, err := a.srv.Backup(ctx, a.by(), path)
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	r, err := res.NewResult()
	if err != nil {
		return err
	}
	return setBackupResult(r, out)
}

// setBackupResult fills r with what a backup wrote.
func setBackupResult(r schema.BackupResult, out server.BackupResult) error {
	r.SetStreams(uint32(out.Streams))
	r.SetBytes(uint64(out.Bytes))
	r.SetAt(itx.UnixMilli(out.At))
	r.SetFrozenMicros(out.Frozen.Microseconds())
	return r.SetPath(out.Path)
}

// backupWriteTimeout bounds how long a download waits for the caller's sink to take one part:
// a sink that stops answering ends the download (and its scratch copy on the server).
const backupWriteTimeout = time.Minute

func (a *admin) Download(ctx context.Context, call schema.Admin_download) error {
	if err := a.deployment("download"); err != nil {
		return fail(err)
	}
	sink := call.Args().Sink()
	if !sink.IsValid() {
		return fail(itx.Errorf(itx.EInvalid, "download: no sink"))
	}
	sink = sink.AddRef()
	defer sink.Release()
	call.Go()
	out, err := a.srv.Download(ctx, a.by(), func(path string, offset int64, data []byte) error {
		wctx, cancel := context.WithTimeout(ctx, backupWriteTimeout)
		defer cancel()
		fut, release := sink.Write(wctx, func(p schema.BackupSink_write_Params) error {
			p.SetOffset(uint64(offset))
			if err := p.SetData(data); err != nil {
				return err
			}
			return p.SetPath(path)
		})
		defer release()
		if _, err := fut.Struct(); err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return itx.Errorf(itx.EUnavailable, "download: the sink did not take %s at %d within %s", path, offset, backupWriteTimeout)
			}
			return itx.Errorf(itx.EUnavailable, "download: the sink refused %s at %d: %v", path, offset, err)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	r, err := res.NewResult()
	if err != nil {
		return err
	}
	return setBackupResult(r, out)
}
