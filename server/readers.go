package server

import (
	"context"
	"sort"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/storage"
)

// RegisterReader registers a reader under name with a declared checkpoint (at most the head), or
// moves the checkpoint of one already registered. Written through the stream's actor, with the
// stream's other state, so it survives restarts. A reader has no delivery obligation: registering
// makes its lag visible.
func (s *Server) RegisterReader(ctx context.Context, ref StreamRef, name string, checkpoint int64) error {
	return waitReader(ctx)(s.StartRegisterReader(ctx, ref, name, checkpoint))
}

// RemoveReader removes a registered reader; ENotFound if there is none of that name.
func (s *Server) RemoveReader(ctx context.Context, ref StreamRef, name string) error {
	return waitReader(ctx)(s.StartRemoveReader(ctx, ref, name))
}

// ReaderCaller is who registers, moves or removes a reader. A reader is its registrant's: its
// checkpoint holds back trims, and any holder that reads the stream lists the readers' names, so
// were a name anyone's to move, one tenant (or a browser's read-only capability) could move
// another's checkpoint past what it has read, or remove it, and let a trim delete what that
// reader still needs.
type ReaderCaller struct {
	TokenID string // the caller's token ("": the server itself, or a caller in-process)
	// Principal is the caller's token's itx.TokenInfo.Principal: a reader is recorded as its
	// principal's, so a rotated token (made with the same label and scope) keeps it.
	Principal string
	Admin     bool // the caller holds the admin right: it moves and removes anyone's
	// NoHold: the caller lacks the subscribe right (a read-only token, a readOnly()
	// attenuation): the reader it registers shows its lag but holds back no trim. Holding the
	// stream's events for a consumer is what subscribe grants; were it read's, any reader could
	// keep every event from the administrator's trims and retention policy for good.
	NoHold bool
}

// mayChange refuses a move or a remove of r by another token than the one that registered it.
func (c ReaderCaller) mayChange(r storage.Reader) error {
	// A reader registered before owners were principals names its token's id.
	if r.Owner == "" || c.Admin || r.Owner == c.TokenID || (c.Principal != "" && r.Owner == c.Principal) {
		return nil
	}
	return itx.Errorf(itx.EPermissionDenied, "reader %q was registered by another token: only a login with that token (or one made with its label and scope), or the admin right, moves or removes it (pick another name)", r.Name)
}

// StartRegisterReaderAs is StartRegisterReader on behalf of by: the reader it registers is by's,
// and one another token registered is refused (ReaderCaller).
func (s *Server) StartRegisterReaderAs(ctx context.Context, by ReaderCaller, ref StreamRef, name string, checkpoint int64) (*PendingReader, error) {
	return s.startReaderOp(ctx, ref, readerOp{name: strings.TrimSpace(name), checkpoint: checkpoint, by: by})
}

// StartRemoveReaderAs is StartRemoveReader on behalf of by (see StartRegisterReaderAs).
func (s *Server) StartRemoveReaderAs(ctx context.Context, by ReaderCaller, ref StreamRef, name string) (*PendingReader, error) {
	return s.startReaderOp(ctx, ref, readerOp{name: strings.TrimSpace(name), remove: true, by: by})
}

// StartRegisterReader queues a register (or move) on the stream and returns its pending answer.
// Reader operations queued on one stream apply in queue order: the caller may release its RPC
// call queue (call.Go) only after this returns, so calls sent on one Readers capability apply in
// the order sent (a checkpoint never moves back because two of them raced to the actor).
func (s *Server) StartRegisterReader(ctx context.Context, ref StreamRef, name string, checkpoint int64) (*PendingReader, error) {
	return s.StartRegisterReaderAs(ctx, inProcess, ref, name, checkpoint)
}

// inProcess is the ReaderCaller of a caller in-process (not over RPC): trusted as the admin
// right is, it moves and removes any reader, and one it registers is no token's.
var inProcess = ReaderCaller{Admin: true}

// StartRemoveReader queues a remove on the stream, as StartRegisterReader does a register.
func (s *Server) StartRemoveReader(ctx context.Context, ref StreamRef, name string) (*PendingReader, error) {
	return s.StartRemoveReaderAs(ctx, inProcess, ref, name)
}

// PendingReader is a reader operation queued on its stream's actor.
type PendingReader struct {
	srv *Server
	a   *actor
	op  *readerOp
}

func (s *Server) startReaderOp(ctx context.Context, ref StreamRef, op readerOp) (*PendingReader, error) {
	if err := itx.ValidatePath(ref.Path); err != nil {
		return nil, err
	}
	a, err := s.acquire(ctx, ref)
	if err != nil {
		return nil, err
	}
	op.reply = make(chan error, 1)
	select {
	case a.inbox <- &actorMsg{reader: &op}:
	case <-ctx.Done():
		s.release(a)
		return nil, itx.Errorf(itx.ECancelled, "reader: %v", ctx.Err())
	}
	return &PendingReader{srv: s, a: a, op: &op}, nil
}

// ConfirmSubscription confirms an offset-acking subscription's deliveries through offset (at most
// what was delivered) and returns its confirmed cursor once that is written.
func (s *Server) ConfirmSubscription(ctx context.Context, ref StreamRef, name string, offset int64) (int64, error) {
	p, err := s.StartConfirm(ctx, ref, name, offset)
	if err != nil {
		return 0, err
	}
	return p.Wait(ctx)
}

// StartConfirm queues ConfirmSubscription's operation, as StartRegisterReader does a register.
func (s *Server) StartConfirm(ctx context.Context, ref StreamRef, name string, offset int64) (*PendingConfirm, error) {
	confirmed := new(int64)
	p, err := s.startReaderOp(ctx, ref, readerOp{name: strings.TrimSpace(name), checkpoint: offset, confirm: true, confirmed: confirmed})
	if err != nil {
		return nil, err
	}
	return &PendingConfirm{p: p, confirmed: confirmed}, nil
}

// PendingConfirm is a confirmation queued on its stream's actor.
type PendingConfirm struct {
	p         *PendingReader
	confirmed *int64
}

// Wait blocks until the confirmation is written or refused, and returns the confirmed cursor.
func (p *PendingConfirm) Wait(ctx context.Context) (int64, error) {
	if err := p.p.Wait(ctx); err != nil {
		return 0, err
	}
	return *p.confirmed, nil
}

// Wait blocks until the actor has applied the operation (committed or refused it).
func (p *PendingReader) Wait(ctx context.Context) error {
	select {
	case err := <-p.op.reply:
		p.srv.release(p.a)
		return err
	case <-ctx.Done():
		// Keep the reference until the actor answers, so the stream is not unloaded under it.
		go func() { <-p.op.reply; p.srv.release(p.a) }()
		return itx.Errorf(itx.ECancelled, "reader: %v", ctx.Err())
	}
}

// waitReader waits for a reader operation started with ctx.
func waitReader(ctx context.Context) func(p *PendingReader, err error) error {
	return func(p *PendingReader, err error) error {
		if err != nil {
			return err
		}
		return p.Wait(ctx)
	}
}

// ListReaders lists a stream's registered readers by name.
func (s *Server) ListReaders(ctx context.Context, ref StreamRef) ([]itx.ReaderInfo, error) {
	var out []itx.ReaderInfo
	err := s.withSubscriptions(ctx, ref, func(v view) error {
		out = readerInfos(v)
		return nil
	})
	return out, err
}

func readerInfos(v view) []itx.ReaderInfo {
	out := make([]itx.ReaderInfo, 0, len(v.readers))
	for _, r := range v.readers {
		out = append(out, itx.ReaderInfo{Name: r.Name, Checkpoint: r.Checkpoint, Lag: max(0, v.head-r.Checkpoint), UpdatedAt: r.UpdatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
