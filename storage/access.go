package storage

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/itx-dev/itx"
)

// Token is a project's login credential as stored: its hash, never the token.
type Token struct {
	ID         string
	ProjectID  string
	Label      string
	Prefix     string   // a stream path prefix; "": every path
	Rights     []string // empty: every right
	CreatedAt  int64
	LastUsedAt int64
	ExpiresAt  int64 // 0: never
}

const tokenColumns = `id, project_id, label, prefix, rights, created_at, last_used_at, expires_at`

func scanToken(row interface{ Scan(...any) error }) (Token, error) {
	var t Token
	var rights string
	err := row.Scan(&t.ID, &t.ProjectID, &t.Label, &t.Prefix, &rights, &t.CreatedAt, &t.LastUsedAt, &t.ExpiresAt)
	if rights != "" {
		t.Rights = strings.Split(rights, ",")
	}
	return t, err
}

// AuditRecord is an administrative change's record for the deployment's audit stream. The
// directory keeps it, from the transaction that makes the change, until DeleteAudit says its
// event is in the stream: a crash between the two cannot lose it (see PendingAudits).
type AuditRecord struct {
	ID      string // unique; the idempotency key of its event derives from it
	Type    string
	Payload []byte
}

// insertAudit keeps an audit record in the transaction of its change (nil: none).
func insertAudit(ctx context.Context, db execer, a *AuditRecord) error {
	if a == nil {
		return nil
	}
	if _, err := db.ExecContext(ctx, `insert into audit_outbox (id, type, payload) values (?, ?, ?)`, a.ID, a.Type, a.Payload); err != nil {
		return fmt.Errorf("keep audit record: %w", err)
	}
	return nil
}

// PendingAudits lists the audit records whose events are not known to be in the audit stream
// yet, oldest first.
func (d *Directory) PendingAudits(ctx context.Context) ([]AuditRecord, error) {
	rows, err := d.db.QueryContext(ctx, `select id, type, payload from audit_outbox order by rowid`)
	if err != nil {
		return nil, fmt.Errorf("pending audit records: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var a AuditRecord
		if err := rows.Scan(&a.ID, &a.Type, &a.Payload); err != nil {
			return nil, fmt.Errorf("pending audit records: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// KeepAudit keeps an audit record of something done outside the directory's transactions (a
// backup written, a deleted stream's own pending ones) until its event is in the audit stream,
// as the records of its changes are. A record kept already stays as it is.
func (d *Directory) KeepAudit(ctx context.Context, a *AuditRecord) error {
	if _, err := d.db.ExecContext(ctx, `insert or ignore into audit_outbox (id, type, payload) values (?, ?, ?)`, a.ID, a.Type, a.Payload); err != nil {
		return fmt.Errorf("keep audit record: %w", err)
	}
	return nil
}

// DeleteAudit forgets an audit record whose event is in the audit stream.
func (d *Directory) DeleteAudit(ctx context.Context, id string) error {
	if _, err := d.db.ExecContext(ctx, `delete from audit_outbox where id = ?`, id); err != nil {
		return fmt.Errorf("forget audit record: %w", err)
	}
	return nil
}

// CreateProjectWithToken records a project and its first token, with the audit record of the
// change (nil: none), in one transaction.
func (d *Directory) CreateProjectWithToken(ctx context.Context, p Project, t Token, token string, audit *AuditRecord) error {
	return d.CreateProjectsWithTokens(ctx, []NewProject{{Project: p, Token: t, Secret: token}}, audit)
}

// NewProject is a project to record with its first token.
type NewProject struct {
	Project Project
	Token   Token
	Secret  string // the token itself: only its hash is stored
}

// CreateProjectsWithTokens records projects, each with its first token, and the audit record of
// the change (nil: none), in one transaction: all of them or none (the first start's default
// project and deployment root, which a crash must never leave half made).
func (d *Directory) CreateProjectsWithTokens(ctx context.Context, ps []NewProject, audit *AuditRecord) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create project: %w", err)
	}
	defer tx.Rollback()
	for _, np := range ps {
		p := np.Project
		// projects.token_hash is unique and not null from the first schema; it holds the first
		// token's hash, which login no longer reads (the tokens table is authoritative).
		if _, err := tx.ExecContext(ctx, `insert into projects (id, name, token_hash, deployment, created_at)
		values (?, ?, ?, ?, ?)`, p.ID, p.Name, HashToken(np.Secret), p.Deployment, p.CreatedAt); err != nil {
			if strings.Contains(err.Error(), "UNIQUE") {
				return itx.Errorf(itx.EInvalid, "a project named %q already exists", p.Name)
			}
			return fmt.Errorf("create project: %w", err)
		}
		if err := insertToken(ctx, tx, np.Token, np.Secret); err != nil {
			return err
		}
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create project: %w", err)
	}
	return nil
}

// CreateToken records a token of an existing project; ENotFound if there is none.
func (d *Directory) CreateToken(ctx context.Context, t Token, token string) error {
	return d.CreateTokenBounded(ctx, t, token, 0, nil)
}

// CreateTokenBounded is CreateToken refusing with limitExceeded when the project already holds
// max tokens (0: no bound), keeping the change's audit record (nil: none). The count, the insert
// and the record share one write transaction, so racing creations cannot share the last place.
func (d *Directory) CreateTokenBounded(ctx context.Context, t Token, token string, max int, audit *AuditRecord) error {
	if _, err := d.Project(ctx, t.ProjectID); err != nil {
		return err
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	defer tx.Rollback()
	if max > 0 {
		var n int
		if err := tx.QueryRowContext(ctx, `select count(*) from tokens where project_id = ?`, t.ProjectID).Scan(&n); err != nil {
			return fmt.Errorf("create token: %w", err)
		}
		if n >= max {
			// Full: expired tokens open nothing any more, so they make room first (t.CreatedAt
			// is now). The audit stream keeps their record.
			res, err := tx.ExecContext(ctx, `delete from tokens where project_id = ? and expires_at != 0 and expires_at <= ?`, t.ProjectID, t.CreatedAt)
			if err != nil {
				return fmt.Errorf("create token: %w", err)
			}
			freed, _ := res.RowsAffected()
			n -= int(freed)
		}
		if n >= max {
			return itx.Errorf(itx.ELimitExceeded, "the project holds %d tokens, its most (--max-tokens-per-project); revoke one first", n)
		}
	}
	if err := insertToken(ctx, tx, t, token); err != nil {
		return err
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertToken(ctx context.Context, db execer, t Token, token string) error {
	_, err := db.ExecContext(ctx, `insert into tokens (id, project_id, label, token_hash, prefix, rights, created_at, expires_at)
		values (?, ?, ?, ?, ?, ?, ?, ?)`, t.ID, t.ProjectID, t.Label, HashToken(token), t.Prefix,
		strings.Join(t.Rights, ","), t.CreatedAt, t.ExpiresAt)
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

// Project returns one project; ENotFound if there is none.
func (d *Directory) Project(ctx context.Context, id string) (Project, error) {
	var p Project
	err := d.db.QueryRowContext(ctx, `select id, name, deployment, created_at from projects where id = ?`, id).
		Scan(&p.ID, &p.Name, &p.Deployment, &p.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return p, itx.Errorf(itx.ENotFound, "no project %q", id)
	}
	if err != nil {
		return p, fmt.Errorf("look up project: %w", err)
	}
	return p, nil
}

// TokenByHash finds the token whose hash is that of token and the project it logs into, recording now as
// its last use (unless the disk is full); EUnauthenticated if there is none or it expired.
func (d *Directory) TokenByHash(ctx context.Context, token string, now int64) (Token, Project, error) {
	t, err := scanToken(d.db.QueryRowContext(ctx, `select `+tokenColumns+` from tokens where token_hash = ?`, HashToken(token)))
	if errors.Is(err, sql.ErrNoRows) {
		return t, Project{}, itx.Errorf(itx.EUnauthenticated, "unknown token")
	}
	if err != nil {
		return t, Project{}, fmt.Errorf("log in: %w", err)
	}
	if t.ExpiresAt != 0 && now >= t.ExpiresAt {
		return t, Project{}, itx.Errorf(itx.EUnauthenticated, "the token expired")
	}
	p, err := d.Project(ctx, t.ProjectID)
	if err != nil {
		return t, p, fmt.Errorf("log in: %w", err)
	}
	// The last use is informational (token listings): a full disk leaves it as it was rather
	// than refusing the login, so clients can still log in and read while appends are refused.
	if _, err := d.db.ExecContext(ctx, `update tokens set last_used_at = ? where id = ?`, now, t.ID); err != nil {
		if ErrorCode(err) == itx.EResourceExhausted {
			return t, p, nil
		}
		return t, p, fmt.Errorf("log in: %w", err)
	}
	t.LastUsedAt = now
	return t, p, nil
}

// TokenExists reports whether a token (by id) is still recorded: not revoked.
func (d *Directory) TokenExists(ctx context.Context, id string) (bool, error) {
	var n int
	if err := d.db.QueryRowContext(ctx, `select count(*) from tokens where id = ?`, id).Scan(&n); err != nil {
		return false, fmt.Errorf("log in: %w", err)
	}
	return n > 0, nil
}

// Tokens lists a project's tokens, oldest first.
func (d *Directory) Tokens(ctx context.Context, projectID string) ([]Token, error) {
	rows, err := d.db.QueryContext(ctx, `select `+tokenColumns+` from tokens where project_id = ? order by created_at, id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteToken removes a project's token, keeping the change's audit record (nil: none), in one
// transaction; ENotFound if it has none by that id.
func (d *Directory) DeleteToken(ctx context.Context, projectID, id string, audit *AuditRecord) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `delete from tokens where project_id = ? and id = ?`, projectID, id)
	if err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return itx.Errorf(itx.ENotFound, "project %q has no token %q", projectID, id)
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	return nil
}

// RenameProject renames a project, keeping the change's audit record (nil: none), in one
// transaction; ENotFound if there is none, EInvalid if the name is taken.
func (d *Directory) RenameProject(ctx context.Context, id, name string, audit *AuditRecord) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("rename project: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `update projects set name = ? where id = ?`, name, id)
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE") {
			return itx.Errorf(itx.EInvalid, "a project named %q already exists", name)
		}
		return fmt.Errorf("rename project: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return itx.Errorf(itx.ENotFound, "no project %q", id)
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("rename project: %w", err)
	}
	return nil
}

// CountStreams counts a project's streams.
func (d *Directory) CountStreams(ctx context.Context, projectID string) (int, error) {
	n, err := countStreams(ctx, d.db, projectID)
	if err != nil {
		return 0, fmt.Errorf("count streams: %w", err)
	}
	return n, nil
}

// CountStreamsUnder counts a project's streams at or under the path scope (by segment, as
// ListStreamsUnder reads them); "" or "/" counts them all.
func (d *Directory) CountStreamsUnder(ctx context.Context, projectID, scope string) (int, error) {
	if scope == "" || scope == "/" {
		return d.CountStreams(ctx, projectID)
	}
	var n int
	// The range lets the (project_id, path) index read only the scope's entries (see
	// listStreamsQuery); the substr keeps /in-x out of /in.
	err := d.db.QueryRowContext(ctx, `select count(*) from streams where project_id = ? and path >= ? and path < ?
		and (path = ? or substr(path, 1, ?) = ?)`,
		projectID, scope, scope+"0", scope, len(scope)+1, scope+"/").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count streams: %w", err)
	}
	return n, nil
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// countStreams reads a project's stream count from stream_counts (no row: none).
func countStreams(ctx context.Context, db queryer, projectID string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `select streams from stream_counts where project_id = ?`, projectID).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

// DeleteProject removes a project with its tokens, secrets and the directory entries of its
// streams (their alarms and parked marks too), keeping the change's audit record (nil: none),
// in one transaction. The streams' files are the caller's to remove, after this commits: the
// same transaction records the streams as deleted (DeletedStreams) until the caller says their
// files are gone (ForgetDeletedStreams), so a crash in between cannot leave them on disk for good.
func (d *Directory) DeleteProject(ctx context.Context, id string, audit *AuditRecord) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete project: %w", err)
	}
	defer tx.Rollback()
	for _, q := range []string{
		`insert into deleted_streams (stream_id) select stream_id from streams where project_id = ?`,
		`delete from alarms where stream_id in (select stream_id from streams where project_id = ?)`,
		`delete from parked where stream_id in (select stream_id from streams where project_id = ?)`,
		`delete from streams where project_id = ?`,
		`delete from secret_uses where project_id = ?`,
		`delete from secrets where project_id = ?`,
		`delete from tokens where project_id = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("delete project: %w", err)
		}
	}
	res, err := tx.ExecContext(ctx, `delete from projects where id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete project: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return itx.Errorf(itx.ENotFound, "no project %q", id)
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete project: %w", err)
	}
	return nil
}

// DeleteStream deletes one stream's directory entry, with its alarm, parked marks and secret
// uses, and keeps the audit record, in one transaction that records the stream as deleted
// (DeletedStreams) until the caller says its files are gone (ForgetDeletedStreams). refs are the
// webhook secret references the stream used (the caller deletes those nothing else uses). A
// stream the directory does not hold is ENotFound, and nothing is written.
func (d *Directory) DeleteStream(ctx context.Context, streamID string, audit *AuditRecord) (refs []string, err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `select ref from secret_uses where stream_id = ? order by ref`, streamID)
	if err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	for rows.Next() {
		var ref string
		if err := rows.Scan(&ref); err != nil {
			rows.Close()
			return nil, fmt.Errorf("delete stream: %w", err)
		}
		refs = append(refs, ref)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `insert into deleted_streams (stream_id) select stream_id from streams where stream_id = ?`, streamID); err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	for _, q := range []string{
		`delete from alarms where stream_id = ?`,
		`delete from parked where stream_id = ?`,
		`delete from secret_uses where stream_id = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, streamID); err != nil {
			return nil, fmt.Errorf("delete stream: %w", err)
		}
	}
	res, err := tx.ExecContext(ctx, `delete from streams where stream_id = ?`, streamID)
	if err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, itx.Errorf(itx.ENotFound, "no stream %q", streamID)
	}
	if err := insertAudit(ctx, tx, audit); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("delete stream: %w", err)
	}
	return refs, nil
}

// DeletedStreams lists the streams deleted from the directory whose files may still be on disk
// (a crash, or a failure, came between their delete and the removal of their files). None of
// them is a live stream: the directory never holds an entry under an ID listed here.
func (d *Directory) DeletedStreams(ctx context.Context) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `select stream_id from deleted_streams order by stream_id`)
	if err != nil {
		return nil, fmt.Errorf("deleted streams: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("deleted streams: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// ForgetDeletedStreams forgets deleted streams whose files are gone for good (removed, and the
// removal durable). Forgetting one already forgotten changes nothing.
func (d *Directory) ForgetDeletedStreams(ctx context.Context, streamIDs []string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("forget deleted streams: %w", err)
	}
	defer tx.Rollback()
	for _, id := range streamIDs {
		if _, err := tx.ExecContext(ctx, `delete from deleted_streams where stream_id = ?`, id); err != nil {
			return fmt.Errorf("forget deleted streams: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("forget deleted streams: %w", err)
	}
	return nil
}

// StoreSecret records a project's webhook secret under its reference (the same secret, the same
// reference: storing it again changes nothing).
func (d *Directory) StoreSecret(ctx context.Context, projectID, ref, secret string, now int64) error {
	_, err := d.db.ExecContext(ctx, `insert into secrets (project_id, ref, secret, created_at) values (?, ?, ?, ?)
		on conflict (project_id, ref) do nothing`, projectID, ref, secret, now)
	if err != nil {
		return fmt.Errorf("store secret: %w", err)
	}
	return nil
}

// AddSecretUses records that the catalog of stream streamID (of projectID) references refs. It
// runs before the commit that makes the reference, so a committed reference always has its row.
func (d *Directory) AddSecretUses(ctx context.Context, projectID, streamID string, refs []string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add secret uses: %w", err)
	}
	defer tx.Rollback()
	for _, ref := range refs {
		if _, err := tx.ExecContext(ctx, `insert or ignore into secret_uses (stream_id, project_id, ref) values (?, ?, ?)`,
			streamID, projectID, ref); err != nil {
			return fmt.Errorf("add secret uses: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("add secret uses: %w", err)
	}
	return nil
}

// RemoveSecretUses forgets that stream streamID references refs: after the commit that dropped
// them from its catalog.
func (d *Directory) RemoveSecretUses(ctx context.Context, streamID string, refs []string) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("remove secret uses: %w", err)
	}
	defer tx.Rollback()
	for _, ref := range refs {
		if _, err := tx.ExecContext(ctx, `delete from secret_uses where stream_id = ? and ref = ?`, streamID, ref); err != nil {
			return fmt.Errorf("remove secret uses: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("remove secret uses: %w", err)
	}
	return nil
}

// DeleteSecretIfUnused deletes a project's secret when no stream's catalog references it, in
// one statement (the check and the delete cannot be split by another writer). deleted says
// whether it did.
func (d *Directory) DeleteSecretIfUnused(ctx context.Context, projectID, ref string) (deleted bool, err error) {
	res, err := d.db.ExecContext(ctx, `delete from secrets where project_id = ? and ref = ?
		and not exists (select 1 from secret_uses where project_id = ? and ref = ?)`, projectID, ref, projectID, ref)
	if err != nil {
		return false, fmt.Errorf("delete secret: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("delete secret: %w", err)
	}
	return n > 0, nil
}

// UnusedSecrets lists the secrets (project id, reference) no stream's catalog references.
func (d *Directory) UnusedSecrets(ctx context.Context) ([][2]string, error) {
	rows, err := d.db.QueryContext(ctx, `select project_id, ref from secrets s where not exists
		(select 1 from secret_uses u where u.project_id = s.project_id and u.ref = s.ref)`)
	if err != nil {
		return nil, fmt.Errorf("unused secrets: %w", err)
	}
	defer rows.Close()
	var out [][2]string
	for rows.Next() {
		var k [2]string
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			return nil, fmt.Errorf("unused secrets: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Secrets returns every stored secret by project and reference.
func (d *Directory) Secrets(ctx context.Context) (map[[2]string]string, error) {
	rows, err := d.db.QueryContext(ctx, `select project_id, ref, secret from secrets`)
	if err != nil {
		return nil, fmt.Errorf("load secrets: %w", err)
	}
	defer rows.Close()
	out := map[[2]string]string{}
	for rows.Next() {
		var p, r, s string
		if err := rows.Scan(&p, &r, &s); err != nil {
			return nil, fmt.Errorf("load secrets: %w", err)
		}
		out[[2]string{p, r}] = s
	}
	return out, rows.Err()
}

// Setting returns the server-wide setting name, nil when it was never set.
func (d *Directory) Setting(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := d.db.QueryRowContext(ctx, `select value from settings where key = ?`, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("setting %s: %w", name, err)
	}
	return v, nil
}

// SetSetting writes the server-wide setting name.
func (d *Directory) SetSetting(ctx context.Context, name string, value []byte) error {
	if _, err := d.db.ExecContext(ctx, `insert into settings (key, value) values (?, ?)
		on conflict (key) do update set value = excluded.value`, name, value); err != nil {
		return fmt.Errorf("setting %s: %w", name, err)
	}
	return nil
}

// Confirm commits a transaction that records only when it ran (the setting "confirmed-at"). A
// commit that failed (a failing fsync, a full disk) is rolled back, but the pages it wrote to the
// write-ahead log may still be read back as committed after a crash; once a later commit is
// durable they no longer can (it overwrites them, and recovery stops at the first frame whose
// checksum does not follow). A caller undoing what it did for a commit that failed calls this
// first.
func (d *Directory) Confirm(ctx context.Context, now int64) error {
	return d.SetSetting(ctx, "confirmed-at", []byte(strconv.FormatInt(now, 10)))
}

// SettingKey returns the server-wide random key named name, creating it (n random bytes) on
// first use.
func (d *Directory) SettingKey(ctx context.Context, name string, n int) ([]byte, error) {
	fresh := make([]byte, n)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	if _, err := d.db.ExecContext(ctx, `insert into settings (key, value) values (?, ?) on conflict (key) do nothing`, name, fresh); err != nil {
		return nil, fmt.Errorf("setting %s: %w", name, err)
	}
	var v []byte
	if err := d.db.QueryRowContext(ctx, `select value from settings where key = ?`, name).Scan(&v); err != nil {
		return nil, fmt.Errorf("setting %s: %w", name, err)
	}
	return v, nil
}
