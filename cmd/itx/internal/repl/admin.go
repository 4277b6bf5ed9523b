package repl

import (
	"context"
	"math"
	"strings"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

// The Admin interface (project.admin) at the prompt: projects and tokens.
func init() {
	bindings["Admin"] = map[string]binding{
		"createProject": {"createProject(name) -> {id, name, token, tokenInfo} (the token is shown only now)", adminCreateProject},
		"listProjects":  {"listProjects(after?, limit?) or listProjects({after, limit}) -> [{id, name, deployment, createdAt, streamCount}] (in id order, every page unless limit is given)", adminListProjects},
		"renameProject": {"renameProject(projectId, name)", adminRenameProject},
		"deleteProject": {"deleteProject(projectId, force?) (force: delete its streams and their files too)", adminDeleteProject},
		"createToken":   {"createToken({projectId, label, prefix, rights: [\"read\", \"append\", \"subscribe\", \"admin\"], expiresInMs}) -> {token, info} (the token is shown only now)", adminCreateToken},
		"listTokens":    {"listTokens(projectId?) -> [{id, label, createdAt, lastUsedAt, expiresAt, prefix, rights}]", adminListTokens},
		"revokeToken":   {"revokeToken(projectId, tokenId) (at once: its sessions are disconnected)", adminRevokeToken},
		"backup":        {"backup(path) -> {path, streams, bytes, at, frozenMs} (the deployment root: itxd copies its data directory, as it stood at one instant, to a new directory at that absolute path on its machine; itxd --data <path> restores it)", adminBackup},
		"download":      {"download(dir) -> {path, streams, bytes, at, frozenMs} (the deployment root: the same copy, sent over the connection and written to a new directory dir on this machine)", adminDownload},
	}
	navigators["Project.admin"] = func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Project(c).Admin(ctx, nil)
		return capnp.Client(f.Admin()).AddRef(), release
	}
	navigators["Stream.readOnly"] = func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Stream(c).ReadOnly(ctx, nil)
		return capnp.Client(f.Stream()).AddRef(), release
	}
	navigators["Stream.appendOnly"] = func(ctx context.Context, c capnp.Client, _ string) (capnp.Client, capnp.ReleaseFunc) {
		f, release := schema.Stream(c).AppendOnly(ctx, nil)
		return capnp.Client(f.Stream()).AddRef(), release
	}
}

// TokenJS is a token's description as itx prints it (never the token itself).
type TokenJS struct {
	ID         string   `json:"id"`
	ProjectID  string   `json:"projectId"`
	Label      string   `json:"label"`
	CreatedAt  msTime   `json:"createdAt"`
	LastUsedAt msTime   `json:"lastUsedAt"`
	ExpiresAt  msTime   `json:"expiresAt"`
	Prefix     string   `json:"prefix"`
	Rights     []string `json:"rights"`
}

// TokenOf converts a token's description for printing.
func TokenOf(t itx.TokenInfo) TokenJS {
	out := TokenJS{ID: t.ID, ProjectID: t.ProjectID, Label: t.Label, CreatedAt: msTime(t.CreatedAt),
		LastUsedAt: msTime(t.LastUsedAt), ExpiresAt: msTime(t.ExpiresAt), Prefix: t.Scope.Prefix, Rights: []string{}}
	for _, r := range t.Scope.Rights {
		out.Rights = append(out.Rights, string(r))
	}
	if len(out.Rights) == 0 {
		out.Rights = []string{"all"}
	}
	return out
}

// ProjectJS is a project row as itx prints it.
type ProjectJS struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Deployment  bool   `json:"deployment"`
	CreatedAt   msTime `json:"createdAt"`
	StreamCount int    `json:"streamCount"`
}

// ProjectOf converts a project row for printing.
func ProjectOf(p itx.ProjectSummary) ProjectJS {
	return ProjectJS{ID: p.Info.ID, Name: p.Info.Name, Deployment: p.Info.Deployment, CreatedAt: msTime(p.CreatedAt), StreamCount: p.StreamCount}
}

// CreatedProjectJS is createProject's answer.
type CreatedProjectJS struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Token     string  `json:"token"`
	TokenInfo TokenJS `json:"tokenInfo"`
}

// CreatedTokenJS is createToken's answer.
type CreatedTokenJS struct {
	Token string  `json:"token"`
	Info  TokenJS `json:"info"`
}

func adminCreateProject(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	name, err := s.stringArg("Admin.createProject", args, 0, "name")
	if err != nil {
		return nil, err
	}
	p, token, t, err := client.CreateProject(ctx, schema.Admin(c), name)
	if err != nil {
		return nil, err
	}
	return CreatedProjectJS{ID: p.ID, Name: p.Name, Token: token, TokenInfo: TokenOf(t)}, nil
}

// pages reads a listing at the prompt: with a limit, the one page after `after` (more tells the
// user where the next starts, when there is one); without, every page after it.
func pages[T any](after string, limit int64, page func(after string) ([]T, string, error), more func(shown int, next string)) ([]T, error) {
	var list []T
	for {
		got, next, err := page(after)
		if err != nil {
			return nil, err
		}
		list = append(list, got...)
		if next == "" {
			return list, nil
		}
		if limit > 0 {
			more(len(list), next)
			return list, nil
		}
		after = next
	}
}

// adminListProjects pages as Streams.list does at the prompt: with a limit, the one page after
// `after` (saying where the next starts); without, every page after it.
func adminListProjects(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.listProjects", args, []string{"after", "limit"}, "after", "limit")
	if err != nil {
		return nil, err
	}
	after, limit := o.str("after"), o.uint("limit")
	if err := o.err(); err != nil {
		return nil, err
	}
	list, err := pages(after, limit, func(after string) ([]itx.ProjectSummary, string, error) {
		return client.ListProjectsPage(ctx, schema.Admin(c), after, int(limit))
	}, func(shown int, next string) {
		s.note("%s shown; more follow: listProjects(%q, %d) for the next page, or leave out the limit for all",
			plural(shown, "project"), next, limit)
	})
	if err != nil {
		return nil, err
	}
	out := make([]ProjectJS, len(list))
	for i, p := range list {
		out[i] = ProjectOf(p)
	}
	return out, nil
}

func adminRenameProject(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.renameProject", args, []string{"projectId", "name"}, "projectId", "name")
	if err != nil {
		return nil, err
	}
	id, name := o.str("projectId"), o.str("name")
	if err := o.err(); err != nil {
		return nil, err
	}
	return nil, client.RenameProject(ctx, schema.Admin(c), id, name)
}

func adminDeleteProject(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.deleteProject", args, []string{"projectId", "force"}, "projectId", "force")
	if err != nil {
		return nil, err
	}
	id, force := o.str("projectId"), o.bool("force")
	if err := o.err(); err != nil {
		return nil, err
	}
	return nil, client.DeleteProject(ctx, schema.Admin(c), id, force)
}

func adminCreateToken(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.createToken", args, []string{"projectId", "label"}, "projectId", "label", "prefix", "rights", "expiresInMs")
	if err != nil {
		return nil, err
	}
	opts := client.TokenOptions{Label: o.str("label"), Scope: itx.Scope{Prefix: o.str("prefix")}}
	for _, r := range o.strings("rights") {
		opts.Scope.Rights = append(opts.Scope.Rights, itx.Right(strings.TrimSpace(r)))
	}
	// Counted in milliseconds, not as a time.Duration: one of more than about 292 years
	// overflows a Duration (and wrapped to another expiry).
	if ms := o.uint("expiresInMs"); ms > 0 {
		now := time.Now().UnixMilli()
		if ms > math.MaxInt64-now {
			return nil, itx.Errorf(itx.EInvalid, "Admin.createToken: expiresInMs %d reaches past the last time there is", ms)
		}
		opts.Expires = time.UnixMilli(now + ms)
	}
	id := o.str("projectId")
	if err := o.err(); err != nil {
		return nil, err
	}
	token, info, err := client.CreateToken(ctx, schema.Admin(c), id, opts)
	if err != nil {
		return nil, err
	}
	return CreatedTokenJS{Token: token, Info: TokenOf(info)}, nil
}

func adminListTokens(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.listTokens", args, []string{"projectId"}, "projectId")
	if err != nil {
		return nil, err
	}
	id := o.str("projectId")
	if err := o.err(); err != nil {
		return nil, err
	}
	list, err := client.ListTokens(ctx, schema.Admin(c), id)
	if err != nil {
		return nil, err
	}
	out := make([]TokenJS, len(list))
	for i, t := range list {
		out[i] = TokenOf(t)
	}
	return out, nil
}

func adminRevokeToken(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.revokeToken", args, []string{"projectId", "tokenId"}, "projectId", "tokenId")
	if err != nil {
		return nil, err
	}
	id, tokenID := o.str("projectId"), o.str("tokenId")
	if !o.has("tokenId") {
		o.fail("tokenId", "required (revokeToken(projectId, tokenId); listTokens() shows the ids)")
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	return nil, client.RevokeToken(ctx, schema.Admin(c), id, tokenID)
}

// BackupJS is what a backup wrote, as itx prints it.
type BackupJS struct {
	Path     string  `json:"path"`
	Streams  int     `json:"streams"`
	Bytes    int64   `json:"bytes"`
	At       string  `json:"at"`
	FrozenMs float64 `json:"frozenMs"`
}

// BackupOf is r as itx prints it.
func BackupOf(r client.BackupResult) BackupJS {
	return BackupJS{Path: r.Path, Streams: r.Streams, Bytes: r.Bytes, At: r.At.Format(time.RFC3339Nano),
		FrozenMs: float64(r.Frozen.Microseconds()) / 1000}
}

func adminBackup(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.backup", args, []string{"path"}, "path")
	if err != nil {
		return nil, err
	}
	path := o.str("path")
	if err := o.err(); err != nil {
		return nil, err
	}
	r, err := client.Backup(ctx, schema.Admin(c), path)
	if err != nil {
		return nil, err
	}
	return BackupOf(r), nil
}

func adminDownload(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Admin.download", args, []string{"dir"}, "dir")
	if err != nil {
		return nil, err
	}
	dir := o.str("dir")
	if err := o.err(); err != nil {
		return nil, err
	}
	r, err := client.DownloadBackup(ctx, schema.Admin(c), dir)
	if err != nil {
		return nil, err
	}
	return BackupOf(r), nil
}
