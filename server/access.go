package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// AuditPath is the deployment stream that records token creation and revocation and every
// project change: the log is the product, so the audit trail is a stream like any other.
const AuditPath = "/audit"

// Audit event types appended to the deployment's AuditPath.
const (
	AuditProjectCreated = "admin/project-created"
	AuditProjectRenamed = "admin/project-renamed"
	AuditProjectDeleted = "admin/project-deleted"
	AuditTokenCreated   = "admin/token-created"
	AuditTokenRevoked   = "admin/token-revoked"
	AuditBackupWritten  = "admin/backup-written"
)

// accessState is the server's record of who is logged in with which token, so that a
// revocation reaches the sessions at once, and of the projects being or having been deleted,
// whose streams must not load again.
type accessState struct {
	mu       sync.Mutex
	sessions map[string]map[*Session]struct{} // by token id
	deleted  map[string]bool                  // project ids: deleting or deleted

	secretKey    []byte
	secretMu     sync.RWMutex
	secrets      map[[2]string]string // (project id, reference) -> secret
	secretCounts map[string]int       // project id -> len of its secrets
	secretHolds  map[[2]string]int    // configures between storing a secret and their answer
	// secretsStoring counts a project's distinct secrets being stored (not yet in secrets): the
	// bound counts them, so concurrent configures with distinct secrets cannot pass it together.
	// secretStores counts the stores in progress of each one: the same secret stored twice at
	// once is one more secret, not two.
	secretsStoring map[string]int
	secretStores   map[[2]string]int
}

func newAccessState() *accessState {
	return &accessState{sessions: map[string]map[*Session]struct{}{}, deleted: map[string]bool{},
		secrets: map[[2]string]string{}, secretCounts: map[string]int{}, secretHolds: map[[2]string]int{}, secretsStoring: map[string]int{}, secretStores: map[[2]string]int{}}
}

// loadAccess reads what access needs into memory: the key of secret references and the secrets.
func (s *Server) loadAccess(ctx context.Context) error {
	key, err := s.dir.SettingKey(ctx, "secret-ref-key", 32)
	if err != nil {
		return err
	}
	secrets, err := s.dir.Secrets(ctx)
	if err != nil {
		return err
	}
	s.acc.secretKey, s.acc.secrets = key, secrets
	for k := range secrets {
		s.acc.secretCounts[k[0]]++
	}
	return nil
}

// Session is one login: the project and the token it used. Every call made through the
// capabilities it yields checks it first, so a revoked or expired token stops at once.
type Session struct {
	srv     *Server
	Project itx.ProjectInfo
	Token   itx.TokenInfo

	revoked  atomic.Bool
	expired  atomic.Bool
	onRevoke func()

	live atomic.Int64 // live connections and live-state views open under this login

	endMu    sync.Mutex
	ends     map[uint64]func() // what the session opened that must end with it
	endSeq   uint64
	ended    bool
	expiryMu sync.Mutex
	expiry   itx.Timer // fires at the token's expiry, or alarmSleep on (armExpiry); nil: it does not expire
	closed   bool      // guarded by expiryMu: Close ran, arm no other timer
}

// Check fails with EUnauthenticated once the session's token was revoked or has expired.
func (x *Session) Check() error {
	if x.revoked.Load() {
		return itx.Errorf(itx.EUnauthenticated, "the token was revoked")
	}
	if x.expired.Load() {
		return itx.Errorf(itx.EUnauthenticated, "the token expired")
	}
	if x.Token.ExpiresAt != 0 && itx.UnixMilli(x.srv.clock.Now()) >= x.Token.ExpiresAt {
		return itx.Errorf(itx.EUnauthenticated, "the token expired")
	}
	return nil
}

// DefaultMaxLive bounds the live connections and live-state views open over every login (each
// holds goroutines and buffers, about 30 KiB and 4 goroutines measured for an idle connection).
const DefaultMaxLive = 65_536

// TakeLive counts a live connection or live-state view opening under the session, refused with
// ELimitExceeded past Config.MaxLivePerSession, past Config.MaxLivePerProject over the project's
// logins, or past Config.MaxLive over every login; its
// release runs once (the end of what opened).
func (x *Session) TakeLive() (release func(), err error) {
	limit := int64(x.srv.cfg.MaxLivePerSession)
	if n := x.live.Add(1); n > limit {
		x.live.Add(-1)
		return nil, itx.Errorf(itx.ELimitExceeded, "a login holds at most %d live connections and live-state views open (--max-live-per-login): close some first", limit)
	}
	// The project's share before the global bound: a project at its share is refused with its
	// own flag named, and never takes the room the other projects keep.
	project := x.Project.ID
	if err := x.srv.takeLiveShare(project); err != nil {
		x.live.Add(-1)
		return nil, err
	}
	if n, all := x.srv.live.Add(1), int64(x.srv.cfg.MaxLive); n > all {
		x.srv.live.Add(-1)
		x.srv.releaseLiveShare(project)
		x.live.Add(-1)
		return nil, itx.Errorf(itx.ELimitExceeded, "itxd holds at most %d live connections and live-state views open over all logins (--max-live): close some first", all)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			x.live.Add(-1)
			x.srv.live.Add(-1)
			x.srv.releaseLiveShare(project)
		})
	}, nil
}

// Revoked reports whether the session's token is no longer valid: revoked, or expired.
func (x *Session) Revoked() bool { return x.revoked.Load() || x.expired.Load() }

// OnEnd registers f to run once when the session's token is revoked or expires: the pushes it
// opened (connections, live state, mounts) end with it, whatever else the RPC connection still
// holds. The returned cancel forgets f (call it when the thing f ends is gone first). f must not
// block.
func (x *Session) OnEnd(f func()) (cancel func()) {
	x.endMu.Lock()
	if x.ended {
		x.endMu.Unlock()
		f()
		return func() {}
	}
	if x.ends == nil {
		x.ends = map[uint64]func(){}
	}
	x.endSeq++
	id := x.endSeq
	x.ends[id] = f
	x.endMu.Unlock()
	return func() {
		x.endMu.Lock()
		delete(x.ends, id)
		x.endMu.Unlock()
	}
}

// end runs the registered ends once, side by side, and returns when all have: an end tells its
// client why (within the delivery timeout), and the onRevoke that follows may close the RPC
// connection that notice travels on.
func (x *Session) end() {
	x.endMu.Lock()
	if x.ended {
		x.endMu.Unlock()
		return
	}
	x.ended = true
	ends := x.ends
	x.ends = nil
	x.endMu.Unlock()
	var wg sync.WaitGroup
	for _, f := range ends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	wg.Wait()
}

// Close forgets the session (its RPC connection ended).
func (x *Session) Close() {
	x.expiryMu.Lock()
	x.closed = true
	if x.expiry != nil {
		x.expiry.Stop()
	}
	x.expiryMu.Unlock()
	x.endMu.Lock()
	x.ended, x.ends = true, nil // the connection's end releases what it held
	x.endMu.Unlock()
	a := x.srv.acc
	a.mu.Lock()
	defer a.mu.Unlock()
	if m := a.sessions[x.Token.ID]; m != nil {
		if _, ok := m[x]; ok {
			x.srv.metrics.Sessions.Dec()
		}
		delete(m, x)
		if len(m) == 0 {
			delete(a.sessions, x.Token.ID)
		}
	}
}

// OpenSession logs in with token. onRevoke (may be nil) runs once if the token is revoked while
// the session is open; it must not block.
func (s *Server) OpenSession(ctx context.Context, token string, onRevoke func()) (*Session, error) {
	t, p, err := s.dir.TokenByHash(ctx, token, itx.UnixMilli(s.clock.Now()))
	if err != nil {
		return nil, err
	}
	x := &Session{srv: s, Project: itx.ProjectInfo{ID: p.ID, Name: p.Name, Deployment: p.Deployment}, Token: tokenInfo(t), onRevoke: onRevoke}
	a := s.acc
	a.mu.Lock()
	if a.deleted[p.ID] {
		a.mu.Unlock()
		return nil, itx.Errorf(itx.EUnauthenticated, "unknown token")
	}
	if a.sessions[t.ID] == nil {
		a.sessions[t.ID] = map[*Session]struct{}{}
	}
	a.sessions[t.ID][x] = struct{}{}
	s.metrics.Sessions.Inc()
	a.mu.Unlock()
	// A revocation deletes the token, then revokes its registered sessions. Checking that the
	// token still exists after registering closes the window between the lookup above and the
	// registration: either the revocation sees this session, or this check sees the deletion.
	if ok, err := s.dir.TokenExists(ctx, t.ID); err != nil || !ok {
		x.Close()
		if err != nil {
			return nil, err
		}
		return nil, itx.Errorf(itx.EUnauthenticated, "the token was revoked")
	}
	if t.ExpiresAt != 0 {
		// Expiry ends the session like a revocation: not only its next call fails, what it
		// opened stops pushing at the instant.
		s.armExpiry(x)
	}
	return x, nil
}

// armExpiry ends the session once the wall clock reads its token's expiry, a wall time. The
// timer runs on the monotonic clock, so it sleeps at most alarmSleep and reads the clock again:
// armed for the whole wait, a session went on pushing for as long after the clock stepped past
// the expiry as the wait had left (its calls were refused, by Check), and one whose clock went
// back ended before its token expired.
func (s *Server) armExpiry(x *Session) {
	wait := time.UnixMilli(x.Token.ExpiresAt).Sub(s.clock.Now())
	x.expiryMu.Lock()
	defer x.expiryMu.Unlock()
	if x.closed {
		return
	}
	if wait <= 0 {
		x.expiry = s.clock.AfterFunc(0, func() { s.expireSession(x) })
		return
	}
	x.expiry = s.clock.AfterFunc(min(wait, alarmSleep), func() { s.armExpiry(x) })
}

// expireSession ends a session whose token expired.
func (s *Server) expireSession(x *Session) {
	x.expired.Store(true)
	x.end()
	if x.onRevoke != nil {
		x.onRevoke()
	}
}

// revokeSessions marks every open session of the tokens ids revoked and tells their owners.
func (s *Server) revokeSessions(ids ...string) {
	a := s.acc
	a.mu.Lock()
	var hit []*Session
	for _, id := range ids {
		for x := range a.sessions[id] {
			hit = append(hit, x)
		}
		delete(a.sessions, id)
	}
	s.metrics.Sessions.Sub(float64(len(hit)))
	a.mu.Unlock()
	// Each session's ends wait until its connections and views were told (bounded by the
	// delivery timeout): sessions end side by side, so one stuck client does not hold the
	// others' revocation, nor the revoking call, for a timeout each.
	var wg sync.WaitGroup
	for _, x := range hit {
		if x.revoked.CompareAndSwap(false, true) {
			wg.Go(func() {
				x.end()
				if x.onRevoke != nil {
					x.onRevoke()
				}
			})
		}
	}
	wg.Wait()
}

func tokenInfo(t storage.Token) itx.TokenInfo {
	info := itx.TokenInfo{ID: t.ID, ProjectID: t.ProjectID, Label: t.Label, CreatedAt: t.CreatedAt,
		LastUsedAt: t.LastUsedAt, ExpiresAt: t.ExpiresAt, Scope: itx.Scope{Prefix: t.Prefix}}
	for _, r := range t.Rights {
		info.Scope.Rights = append(info.Scope.Rights, itx.Right(r))
	}
	return info
}

// --- administration --------------------------------------------------------------------------

// Admin is who asks for an administrative change, for the audit record.
type Admin struct {
	TokenID   string
	ProjectID string
}

// CreateProject makes a project and its first token (whole-project scope), returned once.
func (s *Server) CreateProject(ctx context.Context, by Admin, name string) (itx.ProjectInfo, string, itx.TokenInfo, error) {
	if err := itx.ValidateName("project name", name); err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	if err := s.disk.room(); err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err // see CreateToken
	}
	now := itx.UnixMilli(s.clock.Now())
	p := storage.Project{ID: "prj_" + randomHex(8), Name: name, CreatedAt: now}
	token := newToken()
	t := storage.Token{ID: newTokenID(), ProjectID: p.ID, Label: "initial", CreatedAt: now}
	rec, err := auditRecord(by, AuditProjectCreated, map[string]any{"projectId": p.ID, "name": p.Name, "tokenId": t.ID})
	if err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	if err := s.dir.CreateProjectWithToken(ctx, p, t, token, rec); err != nil {
		return itx.ProjectInfo{}, "", itx.TokenInfo{}, err
	}
	info := itx.ProjectInfo{ID: p.ID, Name: p.Name}
	s.audit(ctx, rec)
	return info, token, tokenInfo(t), nil
}

// ListProjects lists a page of the projects, in id order after the id after, with their stream
// counts: limit 0 is DefaultListProjects, at most MaxListProjects. next is the page's last id
// when more may follow.
func (s *Server) ListProjects(ctx context.Context, after string, limit int) (page []itx.ProjectSummary, next string, err error) {
	if limit, err = ListLimit(limit, DefaultListProjects, MaxListProjects); err != nil {
		return nil, "", err
	}
	ps, err := s.dir.ProjectsAfter(ctx, after, limit)
	if err != nil {
		return nil, "", err
	}
	page = make([]itx.ProjectSummary, 0, len(ps))
	for _, p := range ps {
		n, err := s.dir.CountStreams(ctx, p.ID)
		if err != nil {
			return nil, "", err
		}
		page = append(page, itx.ProjectSummary{Info: itx.ProjectInfo{ID: p.ID, Name: p.Name, Deployment: p.Deployment}, CreatedAt: p.CreatedAt, StreamCount: n})
	}
	if len(ps) == limit {
		next = ps[len(ps)-1].ID
	}
	return page, next, nil
}

// ProjectSummary is one project with its stream count.
func (s *Server) ProjectSummary(ctx context.Context, id string) (itx.ProjectSummary, error) {
	p, err := s.dir.Project(ctx, id)
	if err != nil {
		return itx.ProjectSummary{}, err
	}
	n, err := s.dir.CountStreams(ctx, p.ID)
	if err != nil {
		return itx.ProjectSummary{}, err
	}
	return itx.ProjectSummary{Info: itx.ProjectInfo{ID: p.ID, Name: p.Name, Deployment: p.Deployment}, CreatedAt: p.CreatedAt, StreamCount: n}, nil
}

// DefaultListProjects and MaxListProjects bound a page of Admin.listProjects.
const (
	DefaultListProjects = 1000
	MaxListProjects     = 10_000
)

// CountStreamsUnder counts a project's streams at or under the path scope: what a session
// limited to that prefix can list.
func (s *Server) CountStreamsUnder(ctx context.Context, projectID, scope string) (int, error) {
	return s.dir.CountStreamsUnder(ctx, projectID, scope)
}

// Project describes a project as it is now: a session's Project is as it was at login, and a
// rename since changed its name.
func (s *Server) Project(ctx context.Context, id string) (itx.ProjectInfo, error) {
	p, err := s.dir.Project(ctx, id)
	if err != nil {
		return itx.ProjectInfo{}, err
	}
	return itx.ProjectInfo{ID: p.ID, Name: p.Name, Deployment: p.Deployment}, nil
}

// RenameProject renames a project.
func (s *Server) RenameProject(ctx context.Context, by Admin, id, name string) error {
	if err := itx.ValidateName("project name", name); err != nil {
		return err
	}
	if err := s.disk.room(); err != nil {
		return err // see CreateToken
	}
	rec, err := auditRecord(by, AuditProjectRenamed, map[string]any{"projectId": id, "name": name})
	if err != nil {
		return err
	}
	if err := s.dir.RenameProject(ctx, id, name, rec); err != nil {
		return err
	}
	s.audit(ctx, rec)
	return nil
}

// DeleteProject deletes a project: refused (EFailedPrecondition) while it has streams unless
// force, and never for the deployment root. Its tokens stop working first, then its streams
// are unloaded, its directory entries deleted in one transaction and its streams' files removed:
// the transaction records the streams as deleted, so files a crash leaves go at the next start.
func (s *Server) DeleteProject(ctx context.Context, by Admin, id string, force bool) error {
	p, err := s.dir.Project(ctx, id)
	if err != nil {
		return err
	}
	if p.Deployment {
		return itx.Errorf(itx.EFailedPrecondition, "the deployment root cannot be deleted")
	}
	n, err := s.dir.CountStreams(ctx, id)
	if err != nil {
		return err
	}
	if n == 1 && !force {
		return itx.Errorf(itx.EFailedPrecondition, "project %q has 1 stream: delete it with the project by forcing", p.Name)
	}
	if n > 1 && !force {
		return itx.Errorf(itx.EFailedPrecondition, "project %q has %d streams: delete them with it by forcing", p.Name, n)
	}
	tokens, err := s.dir.Tokens(ctx, id)
	if err != nil {
		return err
	}
	// From here no stream of the project loads and no token of it logs in. Its streams go
	// first, so their connections hear streamRemoved, then its sessions end.
	s.acc.mu.Lock()
	s.acc.deleted[id] = true
	s.acc.mu.Unlock()
	if err := s.unloadProject(ctx, id); err != nil {
		s.undeleteProject(id)
		return err
	}
	ids := make([]string, len(tokens))
	for i, t := range tokens {
		ids[i] = t.ID
	}
	s.revokeSessions(ids...)
	entries, err := s.dir.ListStreams(ctx, id, "", "", 1<<30)
	if err != nil {
		s.undeleteProject(id)
		return err
	}
	var kept []storage.AuditRecord // the streams' own pending records (see keepStreamAudits)
	var unread []string
	for _, e := range entries {
		recs, err := s.keepStreamAudits(ctx, e.StreamID)
		if storeUnreadable(err) {
			// Its file is lost or damaged: the forced delete takes it unread, as deleteUnread
			// does a stream's (the project's delete failed on it, and could never succeed).
			s.log.Warn().Err(err).Str("project", id).Str("path", e.Path).Str("streamId", e.StreamID).
				Msg("deleting a project's stream unread, its database could not be read: the audit records it held pending are deleted with it")
			unread = append(unread, e.Path)
			continue
		}
		if err != nil {
			s.undeleteProject(id)
			return itx.Errorf(itx.EUnavailable, "delete project %s: the pending audit records of its stream %s: %v", id, e.Path, err)
		}
		kept = append(kept, recs...)
	}
	fields := map[string]any{"projectId": id, "name": p.Name, "streams": len(entries)}
	if len(unread) > 0 {
		fields["unread"] = unread // the paths of the streams deleted unread
	}
	rec, err := auditRecord(by, AuditProjectDeleted, fields)
	if err != nil {
		s.undeleteProject(id)
		return err
	}
	if err := s.dir.DeleteProject(ctx, id, rec); err != nil {
		return s.deleteProjectFailed(ctx, id, p.Name, err)
	}
	if deleteProjectCommittedHook != nil {
		deleteProjectCommittedHook()
	}
	// The commit recorded the streams as deleted: their files go now, and whatever a crash or
	// a failure leaves of them stays recorded for the next start (removeDeletedStreams). The
	// entries are all the project's streams: none is created once it is marked deleted and
	// unloaded. The caller going away does not stop what the commit made due.
	streamIDs := make([]string, len(entries))
	for i, e := range entries {
		streamIDs[i] = e.StreamID
	}
	removeErr := s.removeStreams(context.WithoutCancel(ctx), streamIDs)
	for _, sid := range streamIDs {
		s.damaged.Delete(sid)
	}
	s.acc.secretMu.Lock()
	for k := range s.acc.secrets {
		if k[0] == id {
			delete(s.acc.secrets, k)
		}
	}
	delete(s.acc.secretCounts, id)
	s.acc.secretMu.Unlock()
	s.forgetProjectShares(id)
	for i := range kept {
		s.audit(ctx, &kept[i])
	}
	s.audit(ctx, rec)
	if removeErr != nil {
		return fmt.Errorf("delete project %s: %w", id, removeErr)
	}
	return nil
}

// undeleteProject lets a project whose delete failed before anything was committed load its
// streams and log in again.
func (s *Server) undeleteProject(id string) {
	s.acc.mu.Lock()
	delete(s.acc.deleted, id)
	s.acc.mu.Unlock()
}

// deleteProjectFailed answers a project delete whose directory commit failed (a failing or a
// full disk): nothing was deleted, and the project is usable again, but only once a later
// directory commit is durable. SQLite rolled the failed one back, yet the pages it wrote may be
// read back as committed after a crash (see storage.Directory.Confirm): appends acknowledged on
// the project meanwhile would then be deleted with it at the next start. Until that commit, which
// is retried in the background while the disk refuses it, the project stays refused. It stayed
// refused until the delete was retried or itxd restarted, its sessions already ended.
func (s *Server) deleteProjectFailed(ctx context.Context, id, name string, cause error) error {
	if itx.ErrorCode(cause) == itx.ENotFound {
		return cause // deleted meanwhile, by another delete
	}
	code := storage.ErrorCode(cause)
	if code == itx.EInternal {
		code = itx.EUnavailable
	}
	gone, err := s.reopenProject(ctx, id)
	if gone {
		return itx.Errorf(itx.ENotFound, "project %q was deleted meanwhile, by another delete", name)
	}
	if err != nil {
		s.log.Warn().Err(cause).Str("project", id).AnErr("confirm", err).
			Msg("project not deleted: the directory refused the delete's commit; the project stays refused until the directory takes a write again")
		s.reopenProjectLater(id, 100*time.Millisecond)
		return itx.Errorf(code, "project %q was not deleted: the directory could not commit the delete (%v); it is refused until the disk takes writes again, then usable (its sessions ended: log in again); retry the delete then", name, cause)
	}
	s.log.Warn().Err(cause).Str("project", id).Msg("project not deleted: the directory refused the delete's commit; the project is usable again")
	return itx.Errorf(code, "project %q was not deleted: the directory could not commit the delete (%v); it is usable again (its sessions ended: log in again); retry the delete once the disk works", name, cause)
}

// reopenProject makes a directory commit durable (storage.Directory.Confirm), then lets the
// project whose delete failed load its streams and log in again: unless the project is gone
// after all, deleted meanwhile.
func (s *Server) reopenProject(ctx context.Context, id string) (gone bool, err error) {
	if err := s.dir.Confirm(ctx, itx.UnixMilli(s.clock.Now())); err != nil {
		return false, err
	}
	if _, err := s.dir.Project(ctx, id); err != nil {
		return itx.ErrorCode(err) == itx.ENotFound, err
	}
	s.undeleteProject(id)
	return false, nil
}

// reopenProjectLater retries reopenProject after d, then backing off up to 5 s, until it
// succeeds or the server closes.
func (s *Server) reopenProjectLater(id string, d time.Duration) {
	s.clock.AfterFunc(d, func() {
		if s.base.Err() != nil {
			return
		}
		if gone, err := s.reopenProject(s.base, id); gone {
			return
		} else if err != nil {
			s.reopenProjectLater(id, min(2*d, 5*time.Second))
			return
		}
		s.log.Info().Str("project", id).Msg("the project whose delete failed is usable again")
	})
}

// deleteProjectCommittedHook, when set (tests), runs in DeleteProject between the directory's
// commit and the removal of the streams' files: the window a crash must not leak files from.
var deleteProjectCommittedHook func()

// removeStreams removes the files of streams the directory recorded as deleted, then forgets
// the records of those whose files are gone for good. A record outlives its files, never the
// reverse, so a crash or a failure at any point leaves what remains for the next start. The
// records name no live stream (see storage.Directory.DeletedStreams): nothing acknowledged on a
// stream that exists is removed.
func (s *Server) removeStreams(ctx context.Context, streamIDs []string) error {
	for _, id := range streamIDs {
		s.backupClaim(id) // a backup whose instant saw the stream copies it as it was
	}
	removed, err := s.backend.Remove(ctx, streamIDs)
	s.quota.forget(removed)
	if len(removed) > 0 {
		if ferr := s.dir.ForgetDeletedStreams(ctx, removed); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	return err
}

// removeDeletedStreams finishes, at start-up, the removals that a crash (or a failure) cut short
// after a project's delete committed. Run again, it finds nothing left to do.
func (s *Server) removeDeletedStreams(ctx context.Context) error {
	ids, err := s.dir.DeletedStreams(ctx)
	if err != nil || len(ids) == 0 {
		return err
	}
	if err := s.removeStreams(ctx, ids); err != nil {
		return fmt.Errorf("remove deleted streams: %w", err)
	}
	s.log.Info().Int("streams", len(ids)).Msg("removed the files of deleted streams that an unclean stop left on disk")
	return nil
}

// unloadProject unloads every loaded stream of a project that is being deleted (see
// unloadDeleted).
func (s *Server) unloadProject(ctx context.Context, id string) error {
	return s.unloadDeleted(ctx, func(ref StreamRef) bool { return ref.ProjectID == id }, "")
}

// unloadDeleted unloads every loaded stream match selects, being deleted (why, told to its
// connections and live views; empty: with its project), whoever holds it: its connections are
// closed as streamRemoved, its live views and barriers end, its deliveries and processors stop
// (their context is cancelled), and each stream unloads once its last holder let go. ctx bounds
// that wait; a stream still held then unloads when it is released, and the delete fails with
// EFailedPrecondition (retry it). The caller keeps the streams from loading again meanwhile.
func (s *Server) unloadDeleted(ctx context.Context, match func(StreamRef) bool, why string) error {
	s.mu.Lock()
	var victims []*actor
	for ref, a := range s.actors {
		if match(ref) {
			delete(s.actors, ref)
			s.unloading[ref] = a
			// Before the cancel, which ends its live views (their engine runs under dctx): they
			// hear streamRemoved, not serverShuttingDown (the removed message posted below
			// came too late for a view that ended first).
			a.deletedWhy = why
			a.deleted.Store(true)
			a.dcancel() // under s.mu: nothing pins it from here on
			if a.refs > 0 {
				a.drained = make(chan struct{})
			}
			victims = append(victims, a)
		}
	}
	var pending []*actor
	for ref, a := range s.unloading {
		if match(ref) {
			pending = append(pending, a)
		}
	}
	s.mu.Unlock()
	unload := func(a *actor) {
		a.unload()
		s.mu.Lock()
		if s.unloading[a.ref] == a {
			delete(s.unloading, a.ref)
		}
		s.mu.Unlock()
	}
	// A load in progress finishes (or fails) first; then a held stream closes its connections,
	// even if the wait below gives up (they would hold it for good).
	drained := make([]chan struct{}, len(victims))
	for i, a := range victims {
		<-a.ready
		s.mu.Lock()
		drained[i] = a.drained
		s.mu.Unlock()
		if drained[i] != nil && a.loadErr == nil {
			a.post(actorMsg{removed: true})
		}
	}
	var held error
	for i, a := range victims {
		if drained[i] == nil {
			unload(a) // held by nobody
			continue
		}
		select {
		case <-drained[i]:
			unload(a)
		case <-ctx.Done():
			held = itx.Errorf(itx.EFailedPrecondition, "stream %s is still in use; retry the delete", a.ref.Path)
			go func() { <-drained[i]; unload(a) }()
		}
	}
	if held != nil {
		return held
	}
	for _, a := range pending {
		if a.loadErr == nil {
			<-a.done
		}
	}
	return nil
}

// projectDeleted reports whether a project is being or has been deleted: its streams stay
// unloaded.
func (s *Server) projectDeleted(id string) bool {
	s.acc.mu.Lock()
	defer s.acc.mu.Unlock()
	return s.acc.deleted[id]
}

// CreateToken makes another token for a project, limited to scope (validated by the caller
// against its own), with an optional expiry (epoch ms; 0: never). The token is returned once.
func (s *Server) CreateToken(ctx context.Context, by Admin, projectID, label string, expiresAt int64, scope itx.Scope) (string, itx.TokenInfo, error) {
	if err := itx.ValidateName("token label", label); err != nil {
		return "", itx.TokenInfo{}, err
	}
	if err := scope.Validate(); err != nil {
		return "", itx.TokenInfo{}, err
	}
	now := itx.UnixMilli(s.clock.Now())
	if expiresAt < 0 || (expiresAt != 0 && expiresAt <= now) {
		return "", itx.TokenInfo{}, itx.Errorf(itx.EInvalid, "expiresAt %d is not in the future", expiresAt)
	}
	// Below the disk reserve nothing that only adds is done: each change is recorded in /audit,
	// whose records may use the reserve (so that what frees space is recorded too), and a loop
	// of creates and revokes would otherwise take the disk to its last byte. Revokes, deletes,
	// trims and a retention policy's own trims still run (a policy change does not: SetRetention).
	if err := s.disk.room(); err != nil {
		return "", itx.TokenInfo{}, err
	}
	t := storage.Token{ID: newTokenID(), ProjectID: projectID, Label: label, Prefix: scope.Prefix, CreatedAt: now, ExpiresAt: expiresAt}
	for _, r := range scope.Rights {
		t.Rights = append(t.Rights, string(r))
	}
	token := newToken()
	rec, err := auditRecord(by, AuditTokenCreated, map[string]any{"projectId": projectID, "tokenId": t.ID, "label": label,
		"expiresAt": expiresAt, "prefix": scope.Prefix, "rights": scope.Rights})
	if err != nil {
		return "", itx.TokenInfo{}, err
	}
	if err := s.dir.CreateTokenBounded(ctx, t, token, s.cfg.MaxTokensPerProject, rec); err != nil {
		return "", itx.TokenInfo{}, err
	}
	s.audit(ctx, rec)
	return token, tokenInfo(t), nil
}

// ListTokens lists a project's tokens (never the tokens themselves).
func (s *Server) ListTokens(ctx context.Context, projectID string) ([]itx.TokenInfo, error) {
	if _, err := s.dir.Project(ctx, projectID); err != nil {
		return nil, err
	}
	ts, err := s.dir.Tokens(ctx, projectID)
	if err != nil {
		return nil, err
	}
	out := make([]itx.TokenInfo, len(ts))
	for i, t := range ts {
		out[i] = tokenInfo(t)
	}
	return out, nil
}

// RevokeToken deletes a token; sessions logged in with it are revoked at once.
func (s *Server) RevokeToken(ctx context.Context, by Admin, projectID, tokenID string) error {
	rec, err := auditRecord(by, AuditTokenRevoked, map[string]any{"projectId": projectID, "tokenId": tokenID})
	if err != nil {
		return err
	}
	if err := s.dir.DeleteToken(ctx, projectID, tokenID, rec); err != nil {
		return err
	}
	s.revokeSessions(tokenID)
	s.audit(ctx, rec)
	return nil
}

// auditRecord is the record of an administrative change for the deployment's audit stream. It
// is made before the change, so the directory keeps it in the change's own transaction: a crash
// after the change can never lose its record (see audit).
func auditRecord(by Admin, typ string, fields map[string]any) (*storage.AuditRecord, error) {
	fields["by"] = map[string]string{"tokenId": by.TokenID, "projectId": by.ProjectID}
	payload, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("audit record: %w", err)
	}
	return &storage.AuditRecord{ID: randomHex(16), Type: typ, Payload: payload}, nil
}

// audit appends to the deployment's audit stream the record the directory kept with its change
// (committed already), then forgets it. The record's id keys the event, so appending it again
// is a duplicate: a failure here (logged, not returned), or a crash before the record is
// forgotten, leaves it for the next start, which appends what is pending (appendPendingAudits).
func (s *Server) audit(ctx context.Context, rec *storage.AuditRecord) {
	if err := s.appendAudit(ctx, rec); err != nil {
		s.log.Error().Err(err).Str("type", rec.Type).Msg("could not record an audit event (it is appended at the next start)")
	}
}

// appendAudit appends rec to the deployment's audit stream (a duplicate when it is there
// already), then forgets the directory's copy of it, if any.
func (s *Server) appendAudit(ctx context.Context, rec *storage.AuditRecord) error {
	// An audit record may use the disk reserve: what an operator does to free space (a trim, a
	// delete) is recorded then too.
	inputs := []itx.EventInput{{Type: rec.Type, Payload: rec.Payload, IdempotencyKey: internalKey("audit", []byte(rec.ID))}}
	err := validateAppend(inputs, authCopy)
	var p *PendingAppend
	if err == nil {
		p, err = s.startAppend(ctx, StreamRef{ProjectID: DeploymentProjectID, Path: AuditPath}, &appendReq{inputs: inputs, authority: authCopy, inReserve: true})
	}
	if err == nil {
		_, err = p.Wait(ctx)
	}
	if err == nil {
		err = s.dir.DeleteAudit(ctx, rec.ID)
	}
	return err
}

// appendPendingAudits appends the audit records of changes whose audit a crash (or a failure)
// cut short. It runs at start-up, before any call is served.
func (s *Server) appendPendingAudits(ctx context.Context) {
	pending, err := s.dir.PendingAudits(ctx)
	if err != nil {
		s.log.Error().Err(err).Msg("pending audit records not appended")
		return
	}
	for i := range pending {
		s.audit(ctx, &pending[i])
	}
}

func newToken() string   { return "itx_" + randomHex(24) }
func newTokenID() string { return "tok_" + randomHex(8) }

// --- webhook secrets ---------------------------------------------------------------------------

// storeSecret keeps a webhook signing secret apart from the log and returns the reference a
// subscription's config records instead: an HMAC of the secret under the server's key, the same
// for the same secret (so configure stays idempotent), and useless to a reader.
//
// The secret is held for the caller until it calls release, once the append that references it
// has been answered (committed or refused): until then nothing collects it, though no stream's
// catalog references it yet. release collects it if by then none does (a refused configure).
// storeSecretHook, when set (tests), runs in storeSecret while the secret is being stored.
var storeSecretHook func()

func (s *Server) storeSecret(ctx context.Context, projectID, secret string) (ref string, release func(), err error) {
	if _, err := itx.WebhookSecretKey(secret); err != nil || !strings.HasPrefix(secret, "whsec_") {
		return "", nil, itx.Errorf(itx.EInvalid, "receiver.secret must be a Standard Webhooks secret (\"whsec_\" followed by base64 of at least 16 bytes)")
	}
	ref = s.acc.fingerprint(projectID, secret)
	key := [2]string{projectID, ref}
	a := s.acc
	// Held first, under the lock the collector takes: a secret being collected is either
	// deleted before this hold (and stored again below) or sees it and stays.
	a.secretMu.Lock()
	_, known := a.secrets[key]
	if !known && a.secretStores[key] == 0 && a.secretCounts[projectID]+a.secretsStoring[projectID] >= s.cfg.MaxSecretsPerProject {
		a.secretMu.Unlock()
		return "", nil, itx.Errorf(itx.ELimitExceeded, "the project holds %d webhook secrets, its most (each distinct secret a subscription references is kept)", s.cfg.MaxSecretsPerProject)
	}
	a.secretHolds[key]++
	if !known {
		if a.secretStores[key]++; a.secretStores[key] == 1 {
			a.secretsStoring[projectID]++
		}
	}
	a.secretMu.Unlock()
	release = func() {
		a.secretMu.Lock()
		if a.secretHolds[key]--; a.secretHolds[key] <= 0 {
			delete(a.secretHolds, key)
		}
		a.secretMu.Unlock()
		s.collectSecrets(context.Background(), projectID, []string{ref})
	}
	if known {
		return ref, release, nil
	}
	if storeSecretHook != nil {
		storeSecretHook()
	}
	err = s.dir.StoreSecret(ctx, projectID, ref, secret, itx.UnixMilli(s.clock.Now()))
	a.secretMu.Lock()
	if err == nil {
		if _, ok := a.secrets[key]; !ok {
			a.secrets[key] = secret
			a.secretCounts[projectID]++
		}
	}
	// Kept (or failed) in the same critical section: the bound never sees the secret in
	// neither count, nor in both.
	if a.secretStores[key]--; a.secretStores[key] <= 0 {
		delete(a.secretStores, key)
		if a.secretsStoring[projectID]--; a.secretsStoring[projectID] <= 0 {
			delete(a.secretsStoring, projectID)
		}
	}
	a.secretMu.Unlock()
	if err != nil {
		release()
		return "", nil, err
	}
	return ref, release, nil
}

// collectSecrets deletes those of a project's secrets refs that no stream's catalog references
// (the directory's secret_uses) and no configure in progress holds. A committed catalog's
// references always have their rows (added before the commit), so this never deletes a secret a
// subscription uses; a failure leaves the secret for the start-up sweep.
func (s *Server) collectSecrets(ctx context.Context, projectID string, refs []string) {
	a := s.acc
	a.secretMu.Lock()
	defer a.secretMu.Unlock()
	for _, ref := range refs {
		key := [2]string{projectID, ref}
		if _, ok := a.secrets[key]; !ok || a.secretHolds[key] > 0 {
			continue
		}
		deleted, err := s.dir.DeleteSecretIfUnused(ctx, projectID, ref)
		if err != nil {
			s.log.Warn().Err(err).Str("project", projectID).Msg("webhook secret not collected")
			continue
		}
		if deleted {
			delete(a.secrets, key)
			a.secretCounts[projectID]--
		}
	}
}

// sweepSecrets deletes every secret no stream's catalog references, except in the projects
// listed unsure (a stream whose references could not be read). It runs at start-up, after the
// stale streams' references were rewritten from their catalogs and before any call is served:
// what a crash between storing a secret and its configure's commit left behind.
func (s *Server) sweepSecrets(ctx context.Context, unsure map[string]bool) {
	unused, err := s.dir.UnusedSecrets(ctx)
	if err != nil {
		s.log.Warn().Err(err).Msg("unused webhook secrets not swept")
		return
	}
	byProject := map[string][]string{}
	for _, k := range unused {
		if !unsure[k[0]] {
			byProject[k[0]] = append(byProject[k[0]], k[1])
		}
	}
	for p, refs := range byProject {
		s.collectSecrets(ctx, p, refs)
	}
}

// foldKey is the key of m that JSON decoding matches to the field name (case-insensitively):
// name itself when absent. Two spellings are refused: which one decoding takes depends on their
// order, which m no longer holds.
func foldKey(m map[string]any, name string, event int) (string, error) {
	found := ""
	for k := range m {
		if strings.EqualFold(k, name) {
			if found != "" {
				return "", itx.Errorf(itx.EInvalid, "event %d: the field %q is spelt twice (%q, %q): field names match case-insensitively", event, name, found, k)
			}
			found = k
		}
	}
	if found == "" {
		return name, nil
	}
	return found, nil
}

// secretRefsOf lists the secret references a catalog's subscriptions hold.
func secretRefsOf(core *coreState) map[string]bool {
	out := map[string]bool{}
	if core == nil {
		return out
	}
	for _, e := range core.Subscriptions {
		if r := e.Config.Receiver.Secret; itx.IsSecretRef(r) {
			out[r] = true
		}
	}
	return out
}

// refDiff lists the references in a and not in b, sorted.
func refDiff(a, b map[string]bool) []string {
	var out []string
	for r := range a {
		if !b[r] {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out
}

// refList is a set of references as a sorted list.
func refList(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

// fingerprint is the reference of a secret in a project.
func (a *accessState) fingerprint(projectID, secret string) string {
	m := hmac.New(sha256.New, a.secretKey)
	m.Write([]byte(projectID))
	m.Write([]byte{0})
	m.Write([]byte(secret))
	return itx.SecretRefPrefix + hex.EncodeToString(m.Sum(nil))[:32]
}

// secret resolves a subscription's secret field: a reference to the stored secret, or a secret
// written into the log before secrets were kept apart (or by a raw append). ok is false for a
// reference this project does not hold.
func (s *Server) secret(projectID, field string) (string, bool) {
	if !itx.IsSecretRef(field) {
		return field, true
	}
	s.acc.secretMu.RLock()
	defer s.acc.secretMu.RUnlock()
	v, ok := s.acc.secrets[[2]string{projectID, field}]
	return v, ok
}

// CheckSecretRef refuses a webhook config that names a secret by its reference (as describe and
// the log show it) rather than giving the secret, unless the subscription of that name on this
// stream already signs with it at that URL (configuring it again as read back). A reference is no
// proof of knowing the secret: anyone who reads a configured event sees it, and itxd would sign
// what that reader chooses, for a URL it chooses, with a secret it never saw. A reference the
// project does not hold signs nothing (its delivery halts, as for one from another server).
func (s *Server) CheckSecretRef(ctx context.Context, ref StreamRef, name, url, secretRef string) error {
	if _, held := s.secret(ref.ProjectID, secretRef); !held {
		return nil
	}
	if name = strings.TrimSpace(name); name != "" {
		d, err := s.DescribeSubscription(ctx, ref, name)
		if r := d.Config.Receiver; err == nil && r.Action == itx.KindWebhookPost && r.URL == url && r.Secret == secretRef {
			return nil
		}
	}
	return itx.Errorf(itx.EPermissionDenied, "receiver.secret is a secret reference: it stands only for the secret subscription %q already signs with at this URL; give the secret itself (whsec_...) to sign anything else", name)
}

// KeepSecretsApart rewrites the raw stream/subscription-configured events of an append whose
// webhook secret is written out, so that the log records its reference, exactly as
// ConfigureSubscription does; a payload it cannot read is left for the append's validation to
// refuse. Other events are untouched. Call release once the append is answered (see
// storeSecret); it is never nil.
func (s *Server) KeepSecretsApart(ctx context.Context, ref StreamRef, inputs []itx.EventInput) (release func(), err error) {
	projectID := ref.ProjectID
	var releases []func()
	release = func() {
		for _, r := range releases {
			r()
		}
	}
	for i := range inputs {
		in := &inputs[i]
		if in.Type != itx.TypeSubscriptionConfigured {
			continue
		}
		// A payload the append's validation refuses is left to it: decoded and encoded again,
		// invalid UTF-8 would come out as U+FFFD and trailing data would be gone.
		if probe := *in; probe.Normalize() != nil {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(string(in.Payload)))
		dec.UseNumber()
		var cfg map[string]any
		if dec.Decode(&cfg) != nil {
			continue
		}
		// Fields match case-insensitively in the config's decoding: "Secret" (or a "Receiver"
		// holding it) is the secret as much as "secret", and must not stay in the log.
		rk, err := foldKey(cfg, "receiver", i)
		if err != nil {
			release()
			return func() {}, err
		}
		r, _ := cfg[rk].(map[string]any)
		sk, err := foldKey(r, "secret", i)
		if err != nil {
			release()
			return func() {}, err
		}
		secret, _ := r[sk].(string)
		if itx.IsSecretRef(secret) {
			if cfg, err := itx.ParseSubscriptionConfig(in.Payload); err == nil {
				if err := s.CheckSecretRef(ctx, ref, cfg.Name, cfg.Receiver.URL, secret); err != nil {
					release()
					return func() {}, fmt.Errorf("event %d: %w", i, err)
				}
			}
			continue
		}
		if secret == "" {
			continue
		}
		if _, err := itx.ParseSubscriptionConfig(in.Payload); err != nil {
			continue // refused by the append's validation, with nothing stored
		}
		ref, rel, err := s.storeSecret(ctx, projectID, secret)
		if err != nil {
			release()
			return func() {}, fmt.Errorf("event %d: %w", i, err)
		}
		releases = append(releases, rel)
		delete(r, sk)
		r["secret"] = ref
		b, err := json.Marshal(cfg)
		if err != nil {
			release()
			return func() {}, itx.Errorf(itx.EInvalid, "event %d: %v", i, err)
		}
		in.Payload = b
	}
	return release, nil
}
