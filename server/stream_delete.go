package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// AuditStreamDeleted records a stream's deletion in the deployment's AuditPath.
const AuditStreamDeleted = "admin/stream-deleted"

// DeletedStream is what DeleteStream removed.
type DeletedStream struct {
	StreamID   string
	HeadOffset int64
	// Unread: the stream's store could not be opened or read (lost or damaged), so it was
	// deleted, forced, without being read: HeadOffset is the head its directory entry last
	// recorded.
	Unread bool
}

// DeleteStream deletes one stream of a project for good: its events, subscriptions, readers,
// scheduled appends and processors' records. Refused (EFailedPrecondition, nothing deleted) while
// the stream has subscriptions, registered readers or open connections, unless force; a stream
// that does not exist is ENotFound; the deployment's audit stream is never deleted.
//
// From the check on, the stream does not load again until the delete ends: calls that need it
// wait (an append racing the delete lands before it, and is deleted with the stream, or after it,
// on a new stream). Its connections hear streamRemoved, its live views end, barriers waiting on
// it fail ENotFound. Then its directory entry is deleted in one transaction with the audit record,
// which also records the stream as deleted, so files a crash leaves behind go at the next start;
// then its files are removed. The next append to the path creates a new stream (offset 1, a new
// stream id): copies and dead letters keyed by stream id never mistake one for the other.
//
// A stream whose store cannot be opened or read (its file lost or damaged) is deleted unread
// when forced, and refused otherwise (see deleteUnread).
func (s *Server) DeleteStream(ctx context.Context, by Admin, ref StreamRef, force bool) (DeletedStream, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return DeletedStream{}, err
	}
	if ref.ProjectID == DeploymentProjectID && ref.Path == AuditPath {
		return DeletedStream{}, itx.Errorf(itx.EFailedPrecondition, "the deployment's audit stream %s cannot be deleted", AuditPath)
	}
	a, err := s.acquire(ctx, ref)
	if storeUnreadable(err) {
		return s.deleteUnread(ctx, by, ref, force, err)
	}
	if err != nil {
		return DeletedStream{}, err
	}
	// From here until the delete ends, the stream does not load again (acquire waits).
	done, err := s.markDeleting(ref)
	if err != nil {
		s.release(a)
		return DeletedStream{}, err
	}
	defer done()
	v := a.view()
	open := 0
	if conns := a.connList.Load(); conns != nil {
		open = conns.open
	}
	if v.streamID == "" {
		s.release(a)
		return DeletedStream{}, itx.Errorf(itx.ENotFound, "no stream %s", ref.Path)
	}
	if in := consumersOf(len(v.core.Subscriptions), len(v.readers), open); in != "" && !force {
		s.release(a)
		return DeletedStream{}, itx.Errorf(itx.EFailedPrecondition, "stream %s has %s: delete it with them by forcing", ref.Path, in)
	}
	a.post(actorMsg{stopRemotes: true}) // best effort: a host that misses it is fenced anyway
	s.release(a)
	ctx, entry, err := s.unloadForDelete(ctx, ref)
	if err != nil {
		return DeletedStream{}, err
	}
	if entry == nil {
		return DeletedStream{}, itx.Errorf(itx.ENotFound, "stream %s was deleted meanwhile (with its project)", ref.Path)
	}
	if entry.StreamID != v.streamID {
		return DeletedStream{}, itx.Errorf(itx.EInternal, "stream %s: the directory names another stream than the one unloaded", ref.Path)
	}
	// The head as the stream's last incarnation left it (an append may have landed after the view).
	gone := DeletedStream{StreamID: entry.StreamID, HeadOffset: max(v.head, entry.HeadOffset)}
	rec, err := auditRecord(by, AuditStreamDeleted, map[string]any{"projectId": ref.ProjectID, "path": ref.Path,
		"streamId": gone.StreamID, "headOffset": gone.HeadOffset, "forced": force})
	if err != nil {
		return DeletedStream{}, err
	}
	// The audit records of the stream's own changes (a trim, a retention policy) that are not in
	// /audit yet go with its files otherwise: the directory keeps them from here.
	kept, err := s.keepStreamAudits(ctx, gone.StreamID)
	if err != nil {
		return DeletedStream{}, itx.Errorf(itx.EUnavailable, "delete stream %s: its pending audit records: %v", ref.Path, err)
	}
	if err := s.commitDelete(ctx, ref, gone.StreamID, rec, kept); err != nil {
		return DeletedStream{}, err
	}
	return gone, nil
}

// unloadForDelete unloads ref, marked deleting, telling what it served that it was deleted, then
// reads its directory entry (nil: gone meanwhile, with its project). The context it returns no
// longer ends with the caller's: what was served was told, so the delete goes on.
func (s *Server) unloadForDelete(ctx context.Context, ref StreamRef) (context.Context, *storage.StreamEntry, error) {
	uctx, cancel := context.WithTimeout(ctx, deleteUnloadTimeout)
	err := s.unloadDeleted(uctx, func(r StreamRef) bool { return r == ref }, fmt.Sprintf("the stream %s was deleted", ref.Path))
	cancel()
	if err != nil {
		return ctx, nil, err
	}
	ctx = context.WithoutCancel(ctx)
	entry, err := s.dir.Stream(ctx, ref.ProjectID, ref.Path)
	return ctx, entry, err
}

// commitDelete deletes a stream's directory entry in one transaction with its audit record rec
// (which records the stream as deleted), then removes its files, then appends kept (its pending
// audit records) and rec to /audit. The stream is unloaded and kept from loading.
func (s *Server) commitDelete(ctx context.Context, ref StreamRef, streamID string, rec *storage.AuditRecord, kept []storage.AuditRecord) error {
	refs, err := s.dir.DeleteStream(ctx, streamID, rec)
	if err != nil {
		return err
	}
	if deleteStreamCommittedHook != nil {
		deleteStreamCommittedHook()
	}
	s.metrics.StreamsDeleted.Inc()
	// The commit made the removal due: what a crash or a failure leaves of it stays recorded for
	// the next start (removeDeletedStreams).
	removeErr := s.removeStreams(ctx, []string{streamID})
	s.damaged.Delete(streamID)
	s.collectSecrets(ctx, ref.ProjectID, refs)
	for i := range kept {
		s.audit(ctx, &kept[i])
	}
	s.audit(ctx, rec)
	if removeErr != nil {
		// Deleted: the directory no longer names it, and the next start removes its files.
		s.log.Warn().Err(removeErr).Str("project", ref.ProjectID).Str("path", ref.Path).Msg("the deleted stream's files are removed at the next start")
	}
	return nil
}

// deleteUnread deletes, forced, a stream whose load failed with cause because its store cannot
// be opened or read (its file lost, damaged, or one itxd may not open): from the directory and
// with its files, without reading it. Without it such a stream answered unavailable for good
// when no backup held it: its path took no new stream, and its alarm stayed owed. It serves no
// subscription, reader or connection while it cannot load, so none is counted; the audit record
// says it was deleted unread, with the head its directory entry last recorded and the cause; the
// audit records it held pending are kept if its file opens for them, lost with it otherwise.
// Not forced, it is refused (EFailedPrecondition, nothing deleted), saying how to delete it.
func (s *Server) deleteUnread(ctx context.Context, by Admin, ref StreamRef, force bool, cause error) (DeletedStream, error) {
	if !force {
		return DeletedStream{}, itx.Errorf(itx.EFailedPrecondition, "stream %s cannot be read (%s): restore its file from a backup (README, Damaged storage), or delete it unread, with everything it held, by forcing",
			ref.Path, itx.ErrorMessage(cause))
	}
	done, err := s.markDeleting(ref)
	if err != nil {
		return DeletedStream{}, err
	}
	defer done()
	// A load begun before the mark ends first; one that succeeded (its file restored meanwhile)
	// is unloaded as deleted, as the forced delete asked.
	ctx, entry, err := s.unloadForDelete(ctx, ref)
	if err != nil {
		return DeletedStream{}, err
	}
	if entry == nil {
		return DeletedStream{}, itx.Errorf(itx.ENotFound, "no stream %s", ref.Path)
	}
	gone := DeletedStream{StreamID: entry.StreamID, HeadOffset: entry.HeadOffset, Unread: true}
	rec, err := auditRecord(by, AuditStreamDeleted, map[string]any{"projectId": ref.ProjectID, "path": ref.Path,
		"streamId": gone.StreamID, "headOffset": gone.HeadOffset, "forced": true, "unread": true, "cause": itx.ErrorMessage(cause)})
	if err != nil {
		return DeletedStream{}, err
	}
	kept, err := s.keepStreamAudits(ctx, gone.StreamID)
	if storeUnreadable(err) {
		s.log.Warn().Err(err).Str("project", ref.ProjectID).Str("path", ref.Path).Msg("the audit records the unreadable stream held pending are deleted with it")
	} else if err != nil {
		return DeletedStream{}, itx.Errorf(itx.EUnavailable, "delete stream %s: its pending audit records: %v", ref.Path, err)
	}
	if err := s.commitDelete(ctx, ref, gone.StreamID, rec, kept); err != nil {
		return DeletedStream{}, err
	}
	s.log.Warn().Str("project", ref.ProjectID).Str("path", ref.Path).Str("streamId", gone.StreamID).Int64("headOffset", gone.HeadOffset).Str("cause", itx.ErrorMessage(cause)).
		Msg("deleted a stream unread, forced: its database could not be read")
	return gone, nil
}

// keepStreamAudits moves the audit records a stream holds pending (auditPendingKey: a trim's or
// a retention policy's, whose append to /audit failed or was cut short) into the directory's
// outbox, before the stream is deleted with them. The stream is unloaded and cannot load. A crash
// after this keeps them twice: their ids key their events, so the second is a duplicate. A store
// that cannot be opened or read is an unreadableStore error (storeUnreadable).
func (s *Server) keepStreamAudits(ctx context.Context, streamID string) ([]storage.AuditRecord, error) {
	s.backupClaim(streamID) // as a load does: a backup that owes the stream holds it first
	store, err := s.backend.Open(ctx, streamID)
	if err != nil && storage.ErrorCode(err) != itx.EResourceExhausted {
		return nil, &unreadableStore{err}
	}
	if err != nil || store == nil {
		return nil, err
	}
	defer store.Close()
	raw, err := store.KV(ctx, auditPendingKey)
	if err != nil && storage.ErrorCode(err) != itx.EResourceExhausted {
		return nil, &unreadableStore{err}
	}
	if err != nil || raw == nil {
		return nil, err
	}
	var recs []storage.AuditRecord
	if err := json.Unmarshal(raw, &recs); err != nil {
		s.log.Warn().Err(err).Str("streamId", streamID).Msg("the stream's pending audit records do not decode; deleted with it")
		return nil, nil
	}
	for i := range recs {
		if err := s.dir.KeepAudit(ctx, &recs[i]); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// deleteUnloadTimeout bounds how long a delete waits for the calls holding the stream (a read
// under way, a connection's last batch) to let go after they were told; past it the delete fails
// with EFailedPrecondition (retry it) and the stream unloads once released.
const deleteUnloadTimeout = 30 * time.Second

// deleteStreamCommittedHook, when set (tests), runs in DeleteStream between the directory's
// commit and the removal of the stream's files.
var deleteStreamCommittedHook func()

// markDeleting keeps ref from loading until done is called (acquire waits for it); one delete
// of a stream at a time.
func (s *Server) markDeleting(ref StreamRef) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deleting[ref] != nil {
		return nil, itx.Errorf(itx.EFailedPrecondition, "stream %s is being deleted already", ref.Path)
	}
	gate := make(chan struct{})
	s.deleting[ref] = gate
	return func() {
		s.mu.Lock()
		delete(s.deleting, ref)
		s.mu.Unlock()
		close(gate)
	}, nil
}

// consumersOf names what a stream about to be deleted still serves, or "" when nothing.
func consumersOf(subscriptions, readers, connections int) string {
	var parts []string
	for _, c := range []struct {
		n    int
		noun string
	}{{subscriptions, "subscription"}, {readers, "registered reader"}, {connections, "open connection"}} {
		switch {
		case c.n == 1:
			parts = append(parts, "1 "+c.noun)
		case c.n > 1:
			parts = append(parts, fmt.Sprintf("%d %ss", c.n, c.noun))
		}
	}
	return strings.Join(parts, ", ")
}
