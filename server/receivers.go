package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/itx-dev/itx"
)

// senderFor builds the send adapter of a subscription's receiver kind.
func (s *Server) senderFor(ref StreamRef, entry *catalogEntry) sender {
	r := entry.Config.Receiver
	switch r.Action {
	case itx.KindWebhookPost:
		secret, known := s.secret(ref.ProjectID, r.Secret)
		key, _ := itx.WebhookSecretKey(secret)
		return &webhookSender{client: s.httpClient, slots: s.webhooks, egress: s.egress, url: r.URL, headers: r.Headers, key: key,
			unknownSecret: !known, batches: entry.Config.WebhookBatches(),
			readsConfirm: entry.Config.WebhookBatches() || entry.Config.ConfirmWindow > 0}
	case itx.KindCopyToStream:
		return &copySender{srv: s, target: StreamRef{ProjectID: ref.ProjectID, Path: r.ReceivingStreamPath}}
	case itx.KindITXCall:
		return &itxCallSender{srv: s, projectID: ref.ProjectID, scope: entry.mountScope(), capability: r.Capability}
	default:
		return &processorSender{srv: s, projectID: ref.ProjectID}
	}
}

// --- webhook-post --------------------------------------------------------------------------

// webhookSender POSTs one event per request (or, when the subscription asked for more, one
// delivery's events); a 2xx acknowledges them and the body is discarded. Requests are signed the
// Standard Webhooks way when the subscription has a secret.
type webhookSender struct {
	client  *http.Client
	slots   chan struct{} // the server's webhook requests in flight (MaxWebhooksInFlight)
	egress  EgressPolicy  // checked again before each request: the URL may predate the policy
	url     string
	headers map[string]string
	key     []byte
	// unknownSecret: the config names a secret reference this project does not hold (a raw
	// append of a configured event): nothing is sent unsigned in its place.
	unknownSecret bool
	// batches: the body is an itx.WebhookBatchBody (maxDeliveryEvents above 1), not a WebhookBody.
	batches bool
	// readsConfirm: the subscription takes batches or is offset-acking, so a 2xx's body may
	// name a confirmedOffset (confirmedIn); with one POST per event the 2xx alone acknowledges.
	readsConfirm bool
}

func (w *webhookSender) String() string          { return "webhook" }
func (w *webhookSender) inFlight() chan struct{} { return w.slots }

func (w *webhookSender) send(ctx context.Context, d *deliverer, b *itx.DeliveryBatch) (int64, error) {
	if w.unknownSecret {
		// The config, not the event, is at fault, and no retry can fix it: terminal.
		return 0, withClass(classTerminal, itx.Errorf(itx.EFailedPrecondition, "the webhook's secret reference is not one this project holds: configure the subscription with its secret"))
	}
	if err := w.egress.checkURL(w.url); err != nil {
		return 0, refusedAtSend(err) // configured before the policy (or replayed): nothing is dialled
	}
	var body []byte
	var err error
	if w.batches {
		body, err = json.Marshal((*itx.WebhookBatchBody)(b))
	} else {
		body, err = json.Marshal(itx.WebhookBody{DeliveryEnvelope: b.DeliveryEnvelope, Event: b.Events[0]})
	}
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	// One send is one request on the wire: without a way to rewind the body, net/http cannot
	// replay the POST by itself on a broken reused connection after writing it (which it does
	// for requests carrying an Idempotency-Key header, one a subscription may configure). The
	// retry ladder decides about retries, and counts them. A request never written is still
	// retried by net/http (nothing reached the receiver).
	req.GetBody = nil
	for k, v := range w.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "itxd")
	// Standard Webhooks: the id is stable across retries of the same delivery (the same events
	// under the same seek epoch); a receiver dedupes on (streamId, offset), as a retry of a
	// batch may carry more events, under another id.
	id := b.DeliveryID
	ts := strconv.FormatInt(d.srv.clock.Now().Unix(), 10)
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", ts)
	if w.key != nil {
		req.Header.Set("webhook-signature", SignWebhook(w.key, id, ts, body))
	}
	d.srv.metrics.WebhooksInFlight.Inc()
	defer d.srv.metrics.WebhooksInFlight.Dec()
	resp, err := w.client.Do(req)
	if err != nil {
		// The error quotes the URL, and becomes the cursor's lastError (list, describe, live
		// state, a halt's record), which readers see: its credentials are the administrator's.
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = itx.RedactURL(ue.URL)
		}
		if ctx.Err() != nil {
			return 0, itx.Errorf(itx.EDeadlineExceeded, "webhook: %v", err)
		}
		var refusal *egressRefusal
		if errors.As(err, &refusal) {
			return 0, refusedAtSend(refusal.err) // the name resolved to a refused address
		}
		if strings.Contains(err.Error(), "response headers exceeded") { // net/http has no sentinel for it
			// The receiver's fault, not the event's: retried as an outage until it answers shorter.
			return 0, withClass(classOutage, fmt.Errorf("webhook: %w (--webhook-max-response-header-bytes)", err))
		}
		// Refused connections, resets, DNS failures: the receiver is down, not this event.
		return 0, withClass(classOutage, fmt.Errorf("webhook: %w", err))
	}
	// The status decides. The body is read (so the connection is reused) for at most
	// webhookDrainTime and webhookBodyBytes: a receiver that answers 2xx and then keeps its body
	// open has acknowledged, and must not be redelivered after the delivery timeout.
	drain := d.srv.clock.AfterFunc(webhookDrainTime, func() { resp.Body.Close() })
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, webhookBodyBytes))
	drain.Stop()
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		if !w.readsConfirm {
			return 0, nil // seed 000: the 2xx alone acknowledges, the body is discarded
		}
		return confirmedIn(answer), nil
	case resp.StatusCode >= 500, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusRequestTimeout:
		err := &classifiedError{class: classOutage, err: fmt.Errorf("webhook responded %s", resp.Status),
			retryAfter: retryAfter(resp.Header.Get("Retry-After"), d.srv.clock.Now())}
		if err.retryAfter > 0 {
			err.err = fmt.Errorf("webhook responded %s (Retry-After %s)", resp.Status, err.retryAfter)
		}
		return 0, err
	case resp.StatusCode >= 300 && resp.StatusCode <= 399:
		// The endpoint moved, which says nothing against this event: skipping events would
		// not bring them to it.
		return 0, withClass(classOutage, fmt.Errorf("webhook responded %s (redirects are not followed: configure the new URL)", resp.Status))
	}
	return 0, withClass(classEvent, fmt.Errorf("webhook responded %s", resp.Status))
}

// webhookBodyBytes bounds what is read of a webhook's answer.
const webhookBodyBytes = 64 << 10

// confirmedIn reads an offset-acking webhook's answer: a 2xx whose body is a JSON object with a
// non-negative integer confirmedOffset confirms through that offset, as an itx-call Receiver's
// return does (the events after it are delivered again); any other body acknowledges the whole
// delivery (0). The object is read member by member, so a confirmedOffset before the cut still
// counts in an answer longer than the webhookBodyBytes read of it (which no longer parses whole).
func confirmedIn(body []byte) int64 {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return 0
	}
	for d.More() {
		key, err := d.Token()
		if err != nil {
			return 0
		}
		if key != "confirmedOffset" {
			var skip json.RawMessage
			if d.Decode(&skip) != nil {
				return 0
			}
			continue
		}
		var v any
		if d.Decode(&v) != nil {
			return 0
		}
		num, ok := v.(json.Number)
		if !ok {
			return 0
		}
		n, err := strconv.ParseInt(num.String(), 10, 64)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	return 0
}

// retryAfter reads an HTTP Retry-After value, seconds or an HTTP date, as a wait from now (0:
// none, unreadable, or past), at most itx.BackoffCap.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, int64(itx.BackoffCap/time.Second))) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return min(at.Sub(now), itx.BackoffCap) // as the seconds form: lastError names the wait
	}
	return 0
}

// webhookDrainTime bounds how long a webhook's response body is read after its status arrived.
const webhookDrainTime = time.Second

// SignWebhook is the Standard Webhooks signature: "v1," + base64(HMAC-SHA256(key,
// id + "." + timestamp + "." + body)).
func SignWebhook(key []byte, id, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// --- copy-to-stream ------------------------------------------------------------------------

// copySender appends a batch into another stream of the same project. Each copy carries its
// provenance and an idempotency key derived from (subscription, seek epoch, source, offset), so a
// redelivery never duplicates; the receiving stream's inbound fence refuses stale batches.
type copySender struct {
	srv    *Server
	target StreamRef
}

func (c *copySender) String() string { return "copy to " + c.target.Path }

func (c *copySender) send(ctx context.Context, d *deliverer, b *itx.DeliveryBatch) (int64, error) {
	var inputs []itx.EventInput
	var dropped []int64
	var failed *expressionFailure
	confirmed := int64(0) // 0: the whole batch
	for i, e := range b.Events {
		if e.Type == itx.TypeWoken || strings.HasPrefix(e.IdempotencyKey, itx.InternalKeyPrefix+"copy-drop") {
			continue // lifecycle noise and drop audits do not travel
		}
		if len(e.Provenance) >= itx.MaxProvenanceHops || onChain(e.Provenance, c.target.Path) {
			dropped = append(dropped, e.Offset)
			continue
		}
		// The hop records the source event as it was; the transform shapes only the copy.
		hop := itx.Hop{StreamID: b.StreamID, Path: b.Path, Offset: e.Offset, Subscription: b.Subscription,
			CursorChangedAtOffset: b.CursorChangedAtOffset, Type: e.Type}
		shaped := e
		if d.transform != nil {
			var err error
			if shaped, err = d.transform.apply(&e); errors.Is(err, errJSONataBusy) {
				// The server's overload, not the event's: copy the prefix now, and the rest
				// waits for a later try (an outage when nothing went).
				if i == 0 {
					return 0, err
				}
				confirmed = b.Events[i-1].Offset
				break
			} else if err != nil {
				// Copy the healthy prefix now; the failing event waits alone for its verdict.
				failed = &expressionFailure{e.Offset, fmt.Errorf("transform failed on offset %d: %w", e.Offset, err)}
				if i > 0 {
					confirmed = b.Events[i-1].Offset
				}
				break
			}
		}
		key, _ := json.Marshal([]any{b.Subscription, b.CursorChangedAtOffset, b.ProjectID, b.Path, b.StreamID, e.Offset})
		prov := append(append([]itx.Hop{}, e.Provenance...), hop)
		inputs = append(inputs, itx.EventInput{Type: shaped.Type, Payload: shaped.Payload, Metadata: shaped.Metadata,
			IdempotencyKey: internalKey("copy", key), Provenance: prov})
	}
	if len(dropped) > 0 {
		// One audit record per dropped range, keyed so a redelivery does not repeat it.
		first, last := dropped[0], dropped[len(dropped)-1]
		key, _ := json.Marshal([]any{b.ProjectID, b.Path, b.StreamID, b.Subscription, b.CursorChangedAtOffset, first, last})
		payload, _ := json.Marshal(itx.ErrorOccurredPayload{Message: fmt.Sprintf(
			"dropped %d copied event(s) from %q subscription %q (source offsets %d-%d): their copy path already contains this stream or reached %d hops",
			len(dropped), b.Path, b.Subscription, first, last, itx.MaxProvenanceHops)})
		inputs = append(inputs, itx.EventInput{Type: itx.TypeErrorOccurred, Payload: payload,
			IdempotencyKey: internalKey("copy-drop", key)})
	}
	if len(inputs) > 0 {
		stamp := &copyStamp{SourcePath: b.Path, Name: b.Subscription, StreamID: b.StreamID, CursorChangedAtOffset: b.CursorChangedAtOffset}
		if _, err := c.srv.appendAs(ctx, c.target, inputs, authCopy, stamp); err != nil {
			return 0, c.unnamed(err)
		}
		if copyCommittedHook != nil {
			copyCommittedHook()
		}
	}
	if failed != nil {
		return confirmed, failed
	}
	return confirmed, nil // 0: the whole batch; else through the event before a busy one
}

// copyCommittedHook, when set (tests), runs once a copy has committed in the receiving stream and
// before the source learns it: a crash there loses the acknowledgement, and the copy is delivered
// again under the same keys.
var copyCommittedHook func()

// unnamed is an error of the receiving stream without its path, which the subscription's config
// already names: a subscription's lastError, live state row and halt record are read by every
// reader of the source stream, among them sessions limited to a prefix that does not hold the
// receiving stream. The code (and so the failure's class) is kept.
func (c *copySender) unnamed(err error) error {
	var ce *classifiedError
	if c.target.Path == "/" || errors.As(err, &ce) || !strings.Contains(err.Error(), c.target.Path) {
		return err
	}
	e := itx.AsError(err)
	return &itx.Error{Code: e.Code, Message: strings.ReplaceAll(e.Message, c.target.Path, "the receiving stream")}
}

// internalKey is a server-owned idempotency key of a kind over identifying JSON. A key that
// would exceed MaxIdempotencyKeyLength (a 500-character subscription name, a deep path) is
// hashed, so no legal name or path can make a server record impossible to write; shorter keys
// keep their readable form, which is what earlier versions wrote.
func internalKey(kind string, ident []byte) string {
	key := itx.InternalKeyPrefix + kind + ":" + string(ident)
	if len(key) <= itx.MaxIdempotencyKeyLength {
		return key
	}
	sum := sha256.Sum256(ident)
	return itx.InternalKeyPrefix + kind + "#sha256:" + hex.EncodeToString(sum[:])
}

// onChain reports whether a stream path already appears in a provenance chain.
func onChain(chain []itx.Hop, path string) bool {
	for _, h := range chain {
		if h.Path == path {
			return true
		}
	}
	return false
}

// --- itx-call ------------------------------------------------------------------------------

// Receiver is a mounted push receiver (a client's Receiver capability, adapted by the capability
// layer). It returns the offset it confirmed through, 0 for the whole batch.
type Receiver interface {
	Receive(ctx context.Context, batch *itx.DeliveryBatch) (int64, error)
}

// receiverEnder is a Receiver told when the registry lets it go by name: another mount of its
// name replaced it, or an unmount by name removed it. Its mount's own end (its handle) is its
// mounter's to tell. A remote Receiver releases its capability then, which is how its client
// (in any language) learns it: the object's last reference goes (go-capnp's Shutdown, a C++
// destructor).
type receiverEnder interface {
	Receiver
	End()
}

// endReceiver tells m's Receiver that the registry let it go (receiverEnder). Called outside
// the registry's lock: a remote Receiver's release may take the RPC connection's.
func endReceiver(m *mount) {
	if e, ok := m.receiver.(receiverEnder); ok {
		e.End()
	}
}

// mountKey names a mount: mounts are namespaced by the mounting session's scope (its token's
// stream prefix, "" for a whole-project session), and a subscription reaches only the mounts of
// the scope it was configured under (SubscriptionConfig.Scope). So a token limited to a prefix
// neither hands its events to another tenant's receiver nor takes over, removes or lists
// another's mounts; the whole project's subscriptions reach the whole project's mounts.
type mountKey struct{ projectID, scope, name string }

type mount struct {
	receiver Receiver
	at       int64
	gen      uint64 // tells this mount from a later one under the same name
	owner    string // the id of the token that mounted it ("": in-process)
}

// MountCaller is who mounts or unmounts a Receiver. A mount is its token's: the subscriptions of
// its scope deliver to it and take its acknowledgements, so another token of the scope that took
// the name over would receive (and confirm, so its owner never sees them) what was meant for it.
type MountCaller struct {
	TokenID string // the caller's token's itx.TokenInfo.Principal (a rotation keeps it); "": in-process
	Admin   bool   // the admin right unmounts anyone's (never replaces: a mount is a live Receiver)
}

// receivers is the per-project registry of mounted Receivers.
type receivers struct {
	mu        sync.Mutex
	mounts    map[mountKey]*mount
	byProject projectCounts // mounts per project, for Config.MaxMountsPerProject
	gen       uint64        // the last mount's generation

	// pokes are the presence signals running (see schedulePoke), and the absence signals
	// (scheduleUnmounted): a name is in the map while its signal runs, true when another was
	// asked for meanwhile.
	pokeMu sync.Mutex
	pokes  map[pokeKey]bool
}

// pokeKey names one signal about a name of a scope: its mount, or its unmount.
type pokeKey struct {
	mountKey
	gone bool
}

// projectCounts counts a registry's names per project (the zero value is ready to use).
type projectCounts map[string]int

func (pc *projectCounts) add(projectID string) {
	if *pc == nil {
		*pc = projectCounts{}
	}
	(*pc)[projectID]++
}

func (pc projectCounts) remove(projectID string) {
	if pc[projectID]--; pc[projectID] <= 0 {
		delete(pc, projectID)
	}
}

// putLocked sets key's mount, counting a new name against the project.
func (r *receivers) putLocked(key mountKey, m *mount) {
	if r.mounts[key] == nil {
		r.byProject.add(key.projectID)
	}
	r.mounts[key] = m
}

// deleteLocked removes key's mount.
func (r *receivers) deleteLocked(key mountKey) {
	if r.mounts[key] == nil {
		return
	}
	delete(r.mounts, key)
	r.byProject.remove(key.projectID)
}

// MountReceiver mounts r under name in a project's scope (see mountKey), replacing any earlier
// mount of that name in that scope (a reconnecting provider takes over at once). The returned
// function unmounts it if it is still the current mount. Mounting is the presence signal:
// itx-call subscriptions of that scope waiting to retry that capability on loaded streams retry
// at once. The project's bound counts its mounts of every scope.
func (s *Server) MountReceiver(projectID, scope, name string, r Receiver) (func(), error) {
	return s.MountReceiverAs(MountCaller{}, projectID, scope, name, r)
}

// MountReceiverAs is MountReceiver on behalf of by: a name another token's mount holds is
// refused with EPermissionDenied (MountCaller), the same token's is replaced.
func (s *Server) MountReceiverAs(by MountCaller, projectID, scope, name string, r Receiver) (func(), error) {
	if err := itx.ValidateMountName(name); err != nil {
		return nil, err
	}
	m := &mount{receiver: r, at: itx.UnixMilli(s.clock.Now()), owner: by.TokenID}
	key := mountKey{projectID, scope, name}
	s.recv.mu.Lock()
	if old := s.recv.mounts[key]; old != nil && old.owner != by.TokenID {
		s.recv.mu.Unlock()
		return nil, itx.Errorf(itx.EPermissionDenied, "a Receiver another token mounted holds %q: only a login with that token (or one made with its label and scope) replaces it (unmount it with the admin right, or pick another name)", name)
	}
	if s.recv.mounts[key] == nil && s.recv.byProject[projectID] >= s.cfg.MaxMountsPerProject {
		s.recv.mu.Unlock()
		return nil, itx.Errorf(itx.ELimitExceeded, "a project holds at most %d mounted capabilities (--max-mounts-per-project)", s.cfg.MaxMountsPerProject)
	}
	s.recv.gen++
	m.gen = s.recv.gen
	replaced := s.recv.mounts[key]
	s.recv.putLocked(key, m)
	s.recv.mu.Unlock()
	if replaced != nil {
		endReceiver(replaced)
	}
	s.schedulePoke(projectID, scope, name)
	return func() {
		s.recv.mu.Lock()
		gone := s.recv.mounts[key] == m
		if gone {
			s.recv.deleteLocked(key)
		}
		s.recv.mu.Unlock()
		if gone {
			s.scheduleUnmounted(projectID, scope, name)
		}
	}, nil
}

// UnmountReceiver removes whatever is mounted under name in a project's scope.
func (s *Server) UnmountReceiver(projectID, scope, name string) error {
	return s.UnmountReceiverAs(MountCaller{Admin: true}, projectID, scope, name)
}

// UnmountReceiverAs is UnmountReceiver on behalf of by: another token's mount is refused with
// EPermissionDenied unless by holds the admin right.
func (s *Server) UnmountReceiverAs(by MountCaller, projectID, scope, name string) error {
	if err := itx.ValidateMountName(name); err != nil {
		return err
	}
	s.recv.mu.Lock()
	key := mountKey{projectID, scope, name}
	old := s.recv.mounts[key]
	if old == nil {
		s.recv.mu.Unlock()
		return itx.Errorf(itx.ENotFound, "no capability is mounted under %q", name)
	}
	if old.owner != by.TokenID && !by.Admin {
		s.recv.mu.Unlock()
		return itx.Errorf(itx.EPermissionDenied, "a Receiver another token mounted holds %q: only a login with that token (or one made with its label and scope), or the admin right, unmounts it", name)
	}
	s.recv.deleteLocked(key)
	s.recv.mu.Unlock()
	endReceiver(old)
	s.scheduleUnmounted(projectID, scope, name)
	return nil
}

// Mounts lists a project's mounted Receivers of every scope, each with its scope (a caller
// limited to a prefix is shown only its own: see MountsIn).
func (s *Server) Mounts(projectID string) []itx.MountInfo {
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	var out []itx.MountInfo
	for k, m := range s.recv.mounts {
		if k.projectID == projectID {
			out = append(out, itx.MountInfo{Name: k.name, MountedAt: m.at, Scope: k.scope})
		}
	}
	sortMounts(out)
	return out
}

// MountsIn keeps the mounts of list a session of scope may see: its own scope's, or every
// scope's for a whole-project session ("").
func MountsIn(list []itx.MountInfo, scope string) []itx.MountInfo {
	if scope == "" {
		return list
	}
	var out []itx.MountInfo
	for _, m := range list {
		if m.Scope == scope {
			out = append(out, m)
		}
	}
	return out
}

func sortMounts(list []itx.MountInfo) {
	sort.Slice(list, func(i, j int) bool {
		if list[i].Scope != list[j].Scope {
			return list[i].Scope < list[j].Scope
		}
		return list[i].Name < list[j].Name
	})
}

// receiver is the mount under name in a project's scope, nil when none.
func (s *Server) receiver(projectID, scope, name string) *mount {
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	return s.recv.mounts[mountKey{projectID, scope, name}]
}

// schedulePoke runs pokeCapability for a name of a scope in the background (what waits for it
// is presence(scope, name)), one run at a time per name: a mount while one runs asks for one
// more run after it, however many mounts come meanwhile, so a client mounting and unmounting in
// a loop starts no more than one goroutine per name.
func (s *Server) schedulePoke(projectID, scope, name string) {
	s.signal(pokeKey{mountKey{projectID, scope, name}, false}, func() { s.pokeCapability(projectID, presence(scope, name)) })
}

// scheduleUnmounted runs signalUnmounted for a name of a scope in the background, coalesced as
// schedulePoke is.
func (s *Server) scheduleUnmounted(projectID, scope, name string) {
	s.signal(pokeKey{mountKey{projectID, scope, name}, true}, func() { s.signalUnmounted(projectID, presence(scope, name)) })
}

// signal runs fn in the background, one run at a time per key: a request while one runs asks
// for one more run after it, however many come meanwhile.
func (s *Server) signal(key pokeKey, fn func()) {
	r := &s.recv
	r.pokeMu.Lock()
	if _, running := r.pokes[key]; running {
		r.pokes[key] = true
		r.pokeMu.Unlock()
		return
	}
	if r.pokes == nil {
		r.pokes = map[pokeKey]bool{}
	}
	r.pokes[key] = false
	r.pokeMu.Unlock()
	go func() {
		for {
			fn()
			r.pokeMu.Lock()
			if !r.pokes[key] {
				delete(r.pokes, key)
				r.pokeMu.Unlock()
				return
			}
			r.pokes[key] = false
			r.pokeMu.Unlock()
		}
	}()
}

// signalUnmounted tells the project's loaded streams that a capability or processor host (a
// presence token) is no longer mounted: the subscriptions it served park. Unloaded streams park
// them at their next delivery. Run through scheduleUnmounted.
func (s *Server) signalUnmounted(projectID, token string) {
	s.mu.Lock()
	var actors []*actor
	for ref, a := range s.actors {
		if ref.ProjectID == projectID {
			actors = append(actors, a)
		}
	}
	s.mu.Unlock()
	for _, a := range actors {
		if <-a.ready; a.loadErr == nil {
			a.post(actorMsg{unmounted: token})
		}
	}
}

// pokeCapability tells every stream of the project that a capability was mounted: the presence
// signal (token, see presence: it names the mount's scope) that un-parks the itx-call
// subscriptions waiting for it and cuts their backoff. Loaded streams take it
// as an input; unloaded ones parked on the name are loaded, and a stream learns the project's
// mounts when it loads.
func (s *Server) pokeCapability(projectID, token string) {
	// Loaded streams take the signal as an input; so does one loading now, which may have read
	// the project's mounts before this one. One chosen for unloading meanwhile either takes it
	// in its last step or records its parked subscriptions as it closes: wait for that, so the
	// look-up below sees them (a stream between the two would otherwise miss the signal).
	s.mu.Lock()
	var actors, leaving []*actor
	for ref, a := range s.actors {
		if ref.ProjectID == projectID {
			actors = append(actors, a)
		}
	}
	for ref, a := range s.unloading {
		if ref.ProjectID == projectID {
			leaving = append(leaving, a)
		}
	}
	s.mu.Unlock()
	for _, a := range actors {
		if <-a.ready; a.loadErr != nil {
			continue
		}
		a.post(actorMsg{mounted: token})
		if a.dctx.Err() != nil { // chosen for unloading (under s.mu, with dcancel) since
			leaving = append(leaving, a)
		}
	}
	for _, a := range leaving {
		if <-a.ready; a.loadErr == nil {
			<-a.done
		}
	}
	// Unloaded streams whose subscriptions parked waiting for this name load now; a loading
	// stream learns the project's mounts, so it resumes them itself.
	parked, err := s.dir.ParkedOn(s.base, projectID, token)
	if err != nil {
		s.log.Warn().Err(err).Str("capability", token).Msg("finding streams parked on a capability")
		return
	}
	if scope, name, scoped := strings.Cut(token, "\x1f"); scoped {
		// A stream that parked before mounts had scopes recorded the bare name: those inside
		// the scope load too, and record the scoped token as they unload.
		legacy, err := s.dir.ParkedOn(s.base, projectID, name)
		if err != nil {
			s.log.Warn().Err(err).Str("capability", name).Msg("finding streams parked on a capability")
			return
		}
		for _, e := range legacy {
			if strings.HasPrefix(e.Path, scope) {
				parked = append(parked, e)
			}
		}
	}
	for _, e := range parked {
		a, err := s.acquire(s.base, StreamRef{ProjectID: e.ProjectID, Path: e.Path})
		if err == nil {
			s.release(a)
			continue
		}
		if itx.ErrorCode(err) == itx.ELimitExceeded {
			// No room now (--max-held-streams): the stream's alarm loads it as soon as there
			// is, and it learns the mounts as it loads. Dropped, the signal would leave it
			// parked until the next mount.
			now := itx.UnixMilli(s.clock.Now())
			if err := s.dir.SetAlarm(s.base, e.StreamID, now); err != nil {
				s.log.Error().Err(err).Str("project", e.ProjectID).Str("path", e.Path).Msg("parked stream alarm not recorded")
				continue
			}
			s.alarmChanged(now)
		}
	}
}

type itxCallSender struct {
	srv        *Server
	projectID  string
	scope      string // the subscription's: the namespace its capability is looked up in
	capability string
}

func (c *itxCallSender) String() string { return "itx-call " + c.capability }

func (c *itxCallSender) send(ctx context.Context, d *deliverer, b *itx.DeliveryBatch) (int64, error) {
	m := c.srv.receiver(c.projectID, c.scope, c.capability)
	if m == nil {
		return 0, withClass(classAbsent, itx.Errorf(itx.ECapabilityOffline, "capability %q is offline: no Receiver is mounted under that name", c.capability))
	}
	d.reached.Store(m.gen)
	confirmed, err := m.receiver.Receive(ctx, b)
	return confirmed, fromMount(m.gen, err)
}

// --- processor-wake ------------------------------------------------------------------------

// processorSender stands for processor-wake in the sender table: its batch limit sizes the
// frames; the wake itself is the deliverer's (processors.go), which needs the scanned range a
// batch hides.
type processorSender struct {
	srv       *Server
	projectID string
}

func (p *processorSender) String() string { return "processor" }

func (p *processorSender) send(ctx context.Context, d *deliverer, b *itx.DeliveryBatch) (int64, error) {
	return 0, withClass(classTerminal, itx.Errorf(itx.EInternal, "processor-wake is delivered as frames, not batches"))
}
