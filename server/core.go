package server

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/itx-dev/itx"
)

// CoreStateVersion versions the reduction below. Changing what reduce computes means bumping it:
// a stream whose checkpoint carries another version is re-reduced from offset 1 on load.
const CoreStateVersion = 1

// coreStateKey is the kv key of the core-state checkpoint, committed with every change.
const coreStateKey = "core-state"

// bornKey is the KV row a stream's first commit writes (its value the commit's time, epoch ms):
// with the head still 0 (a first commit that registered a reader) it is what says the stream
// exists, where a database at head 0 without it is a creation a crash cut short (see bornIn).
const bornKey = "born"

// authority says who wrote an event: a client, the server itself (halts), or a copy.
type authority int

const (
	authClient authority = iota
	authCore
	authCopy
)

// coreState is the stream's reduced control state: the subscription catalog and the inbound
// copy fences. It is treated as immutable once published: reduce works on a clone.
type coreState struct {
	Version       int                                  `json:"version"`
	Subscriptions map[string]*catalogEntry             `json:"subscriptions"`
	Inbound       map[string]map[string]*inboundRecord `json:"inbound,omitempty"` // source path -> name
	// Effects fences the forwards of processors of other streams: source path -> processor name.
	// Its records are replaced, never changed in place (clone shares them).
	Effects map[string]map[string]*effectFence `json:"effects,omitempty"`
}

// effectFence keeps the idempotency keys of the forwards this stream took from one processor of
// another stream (Args.AppendTo) that a crash may have it make again: those made while processing
// an event above its committed cursor, which is redelivered. A trim of this stream forgets the
// keys of the events it deletes; a forward made again with a key kept here is a duplicate all the
// same. A key goes once the processor's cursor passed the event it came from (Processed, raised by
// its later forwards), or when more than maxFencedEffects are kept (the lowest events' first).
type effectFence struct {
	StreamID  string           `json:"streamId"`  // the source stream's id: another stream at the path starts afresh
	Processed int64            `json:"processed"` // the highest committed cursor a forward was made under
	Keys      map[string]int64 `json:"keys,omitempty"`
	LastAt    int64            `json:"lastAt"`
}

// maxFencedEffects bounds effectFence.Keys.
const maxFencedEffects = 1024

// effectStamp says where a processor's forward comes from (itx.EffectOrigin, with the source).
type effectStamp struct {
	SourcePath string
	Name       string // the processor instance (its subscription's name)
	StreamID   string
	Offset     int64 // the event being processed, above Processed
	Processed  int64 // the processor's committed cursor then
}

// effectTaken reports whether this stream took a forward with key from stamp's processor that
// may be made again (see effectFence).
func (st *coreState) effectTaken(stamp *effectStamp, key string) bool {
	rec := st.Effects[stamp.SourcePath][stamp.Name]
	if rec == nil || rec.StreamID != stamp.StreamID {
		return false
	}
	at, ok := rec.Keys[key]
	return ok && at > rec.Processed
}

// effectsChange reports whether acceptEffects would change the fence: keys to keep, or a cursor
// that lets kept keys go.
func (st *coreState) effectsChange(stamp *effectStamp, keys []string) bool {
	rec := st.Effects[stamp.SourcePath][stamp.Name]
	if rec == nil || rec.StreamID != stamp.StreamID {
		return len(keys) > 0
	}
	return len(keys) > 0 && stamp.Offset > max(rec.Processed, stamp.Processed) || stamp.Processed > rec.Processed && len(rec.Keys) > 0
}

// acceptEffects records the keys of the forwards a stamped append took.
func (st *coreState) acceptEffects(stamp *effectStamp, keys []string, at int64) {
	if st.Effects == nil {
		st.Effects = map[string]map[string]*effectFence{}
	}
	byName := st.Effects[stamp.SourcePath]
	if byName == nil {
		byName = map[string]*effectFence{}
		st.Effects[stamp.SourcePath] = byName
	}
	rec := &effectFence{StreamID: stamp.StreamID, Processed: stamp.Processed, Keys: map[string]int64{}, LastAt: at}
	if old := byName[stamp.Name]; old != nil && old.StreamID == stamp.StreamID {
		rec.Processed = max(old.Processed, stamp.Processed)
		for k, o := range old.Keys {
			if o > rec.Processed {
				rec.Keys[k] = o
			}
		}
	}
	if stamp.Offset > rec.Processed {
		for _, k := range keys {
			rec.Keys[k] = max(rec.Keys[k], stamp.Offset)
		}
	}
	if n := len(rec.Keys); n > maxFencedEffects {
		type kept struct {
			key string
			at  int64
		}
		all := make([]kept, 0, n)
		for k, o := range rec.Keys {
			all = append(all, kept{k, o})
		}
		sort.Slice(all, func(i, j int) bool {
			if all[i].at != all[j].at {
				return all[i].at < all[j].at
			}
			return all[i].key < all[j].key
		})
		for _, k := range all[:n-maxFencedEffects] {
			delete(rec.Keys, k.key)
		}
	}
	if len(rec.Keys) == 0 {
		rec.Keys = nil
	}
	byName[stamp.Name] = rec
	st.trimEffects()
}

// trimEffects keeps at most MaxInboundSourceRecords effect fences, evicting the least recently
// used.
func (st *coreState) trimEffects() {
	evictLeastRecent(st.Effects, itx.MaxInboundSourceRecords, func(r *effectFence) int64 { return r.LastAt })
}

// catalogEntry is one subscription as its events define it.
type catalogEntry struct {
	Config             itx.SubscriptionConfig `json:"config"`             // Name is the effective name
	ConfiguredAtOffset int64                  `json:"configuredAtOffset"` // the config epoch: the birth, moved by each changed config
	ConfiguredAt       int64                  `json:"configuredAt"`
	// ReconfiguredAtOffset is the configured event that set today's config when it changed the
	// config without a new start (0: the birth event did).
	ReconfiguredAtOffset int64 `json:"reconfiguredAtOffset,omitempty"`
	// OccupiedAtOffset is the configured event that took the name while nothing held it: the
	// occupant's identity, kept through changed configs and new starts (the same subscription
	// changing its mind), new only after a removal. A barrier pending on the name compares it, so
	// a subscription removed and configured again in one commit does not answer for the one it
	// replaced (seed 000: names bind, epochs fence). 0 in checkpoints written before it existed;
	// it is compared only within one loaded actor, where any later occupant's is greater.
	OccupiedAtOffset int64              `json:"occupiedAtOffset,omitempty"`
	Halted           *itx.HaltedPayload `json:"halted,omitempty"`
}

// configOffset is the offset of the configured event that set the subscription's config.
func (e *catalogEntry) configOffset() int64 { return max(e.ConfiguredAtOffset, e.ReconfiguredAtOffset) }

// Kind is the receiver kind.
func (e *catalogEntry) Kind() string { return e.Config.Receiver.Action }

// mountScope is the namespace of the mounts the subscription reaches (see mountKey): the scope
// it was configured under, "" for the whole project (which "/" is too).
func (e *catalogEntry) mountScope() string {
	if e.Config.Scope == "/" {
		return ""
	}
	return e.Config.Scope
}

// inboundRecord fences copies from one (source path, subscription name): a batch stamped older
// than the newest accepted one can never land.
type inboundRecord struct {
	StreamID              string `json:"streamId"`
	CursorChangedAtOffset int64  `json:"cursorChangedAtOffset"`
	EventsReceived        int64  `json:"eventsReceived"`
	LastEventReceivedAt   int64  `json:"lastEventReceivedAt"`
	// Through is the highest source offset copied under this stamp (0: not known, as in a
	// checkpoint written before it was kept). A copy at or below it landed already: it is a
	// duplicate though its own key is gone with a trim of this stream (copiedThrough).
	Through int64 `json:"through,omitempty"`
	// The dead letters of an offset-acking subscription are fenced otherwise: it sends again from
	// its confirmed cursor, so it may letter an event below one it lettered before (one its
	// receiver took, then refused when sent again), and Through would take that letter for a
	// duplicate. A letter at or below AckedThrough (the highest confirmed cursor a letter was
	// stamped with) is a duplicate, as the subscription never sends below it again; above it,
	// Lettered holds the offsets it took letters for (the lowest go first past
	// maxLetteredOffsets: their keys still dedupe until a trim takes them).
	AckedThrough int64   `json:"ackedThrough,omitempty"`
	Lettered     []int64 `json:"lettered,omitempty"`
}

// maxLetteredOffsets bounds inboundRecord.Lettered.
const maxLetteredOffsets = 1024

func newCoreState() *coreState {
	return &coreState{Version: CoreStateVersion, Subscriptions: map[string]*catalogEntry{}}
}

func (st *coreState) clone() *coreState {
	c := &coreState{Version: st.Version, Subscriptions: make(map[string]*catalogEntry, len(st.Subscriptions))}
	for k, v := range st.Subscriptions {
		e := *v
		c.Subscriptions[k] = &e
	}
	if st.Inbound != nil {
		c.Inbound = make(map[string]map[string]*inboundRecord, len(st.Inbound))
		for p, byName := range st.Inbound {
			m := make(map[string]*inboundRecord, len(byName))
			for n, r := range byName {
				rr := *r
				rr.Lettered = slices.Clone(r.Lettered)
				m[n] = &rr
			}
			c.Inbound[p] = m
		}
	}
	if st.Effects != nil {
		c.Effects = make(map[string]map[string]*effectFence, len(st.Effects))
		for p, byName := range st.Effects {
			c.Effects[p] = maps.Clone(byName) // the records are replaced, never changed
		}
	}
	return c
}

// effectKind is what a core event does to a cursor row.
type effectKind int

const (
	effectBorn        effectKind = iota // a new row at its start position (birth or same-name replace)
	effectSeek                          // confirmed := offset, seek epoch := the cursor-set's offset
	effectHalt                          // status halted, retry state cleared
	effectResume                        // status active
	effectRemove                        // the row goes
	effectReconfigure                   // a new config keeping the cursor: new birth and seek epoch, active, retry state cleared
	effectRevive                        // a processor's revival: active, due now (the in-flight block stays)
)

// cursorEffect is a cursor-row change the commit must write with the event that caused it.
type cursorEffect struct {
	kind   effectKind
	name   string
	offset int64 // born: initial confirmed; seek: the new confirmed
	epoch  int64 // born: birth offset; seek: the cursor-set event's offset
	err    string
	tries  int // halt: the attempts the halt reports
	// retire (born over an existing subscription): the name's processor ends as at a removal,
	// because the birth replaces a processor-wake subscription or makes one.
	retire bool
}

// reduceContext is what reduce may know besides the state: all of it pure data.
type reduceContext struct {
	path      string
	projectID string
	head      int64                  // the head before this event
	checkURL  func(url string) error // the webhook egress policy
	maxSubs   int
	// maxConfigBytes bounds the payload of a configured event that changes the catalog; 0: no
	// bound (replays keep what was accepted under another bound, step tests).
	maxConfigBytes int
	maxReaders     int                    // registered readers per stream; 0: no bound (step tests)
	compile        func(src string) error // JSONata compilation
	// nameTaken says what else holds a name in the stream's one name space ("an open
	// connection"), or "" if nothing; nil: nothing is checked (replays, step tests).
	nameTaken func(name string) string
	// parked says whether a subscription's row is parked (a resume un-parks it too); nil:
	// every resume in a replayed history is taken as it was accepted.
	parked     func(name string) bool
	authority  authority
	receivedAt int64
}

// reduce validates one event with an assigned offset against st and applies it. It refuses a
// bad event with a typed error (the caller then refuses the whole append). Events that are not
// stream/* and copies of stream/* events are inert here.
func (st *coreState) reduce(e *itx.Event, rc *reduceContext) ([]cursorEffect, error) {
	if !itx.IsCoreType(e.Type) || len(e.Provenance) > 0 {
		return nil, nil // a copied control event is stored but inert
	}
	switch e.Type {
	case itx.TypeSubscriptionConfigured:
		return st.reduceConfigured(e, rc)
	case itx.TypeSubscriptionCursorSet:
		var p itx.CursorSetPayload
		if err := itx.DecodeStrict(e.Payload, &p); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "%s: %v", e.Type, err)
		}
		entry, err := st.existing(p.Name)
		if err != nil {
			return nil, err
		}
		if p.AfterOffset < 0 || p.AfterOffset > rc.head {
			return nil, itx.Errorf(itx.EInvalid, "afterOffset %d is outside 0..%d (the stream's head)", p.AfterOffset, rc.head)
		}
		return []cursorEffect{{kind: effectSeek, name: entry.Config.Name, offset: p.AfterOffset, epoch: e.Offset}}, nil
	case itx.TypeSubscriptionResumed:
		var p itx.NamePayload
		if err := itx.DecodeStrict(e.Payload, &p); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "%s: %v", e.Type, err)
		}
		entry, err := st.existing(p.Name)
		if err != nil {
			return nil, err
		}
		if entry.Halted == nil && (rc.parked == nil || !rc.parked(entry.Config.Name)) {
			return nil, itx.Errorf(itx.EFailedPrecondition, "subscription %q is neither halted nor parked", entry.Config.Name)
		}
		entry.Halted = nil
		return []cursorEffect{{kind: effectResume, name: entry.Config.Name}}, nil
	case itx.TypeSubscriptionRemoved:
		var p itx.RemovedPayload
		if err := itx.DecodeStrict(e.Payload, &p); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "%s: %v", e.Type, err)
		}
		if p.Reason != "requested" {
			return nil, itx.Errorf(itx.EInvalid, "%s: reason must be \"requested\"", e.Type)
		}
		entry, err := st.existing(p.Name)
		if err != nil {
			return nil, err
		}
		delete(st.Subscriptions, entry.Config.Name)
		return []cursorEffect{{kind: effectRemove, name: entry.Config.Name}}, nil
	case itx.TypeSubscriptionHalted:
		if rc.authority != authCore {
			return nil, itx.Errorf(itx.EInvalid, "%s is written by the server only", e.Type)
		}
		var p itx.HaltedPayload
		if err := itx.DecodeStrict(e.Payload, &p); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "%s: %v", e.Type, err)
		}
		entry := st.Subscriptions[p.Name]
		if entry == nil {
			return nil, nil // removed meanwhile: the halt is evidence only
		}
		entry.Halted = &p
		return []cursorEffect{{kind: effectHalt, name: p.Name, err: p.Error, tries: p.Attempts}}, nil
	case itx.TypeErrorOccurred:
		var p itx.ErrorOccurredPayload
		if err := itx.DecodeStrict(e.Payload, &p); err != nil {
			return nil, itx.Errorf(itx.EInvalid, "%s: %v", e.Type, err)
		}
		if strings.TrimSpace(p.Message) == "" {
			return nil, itx.Errorf(itx.EInvalid, "%s: message must not be empty", e.Type)
		}
		return nil, nil
	case itx.TypeProcessorRevived:
		slug, err := revivedProcessor(e.Payload)
		if err != nil {
			return nil, err
		}
		// A revival is the keepalive's attempt (its breaker owns the long backoff): the
		// processor's subscription is delivered to now, even if the ladder halted it or is
		// waiting out a backoff, so the revived incarnation's outcome is seen at once.
		if entry := st.Subscriptions[slug]; entry != nil && entry.Kind() == itx.KindProcessorWake {
			entry.Halted = nil
			return []cursorEffect{{kind: effectRevive, name: slug}}, nil
		}
		return nil, nil
	case itx.TypeWoken:
		if rc.authority != authCore {
			return nil, itx.Errorf(itx.EInvalid, "%s is written by the server only", e.Type)
		}
		return nil, nil
	}
	return nil, itx.Errorf(itx.EInvalid, "unknown core event type %q", e.Type)
}

// revivedProcessor is the processor a stream/processor-revived payload names (its
// processorSlug: the subscription name the keepalive revives), read as the core reduces it.
func revivedProcessor(payload json.RawMessage) (string, error) {
	var p map[string]any
	if err := json.Unmarshal(payload, &p); err != nil {
		return "", itx.Errorf(itx.EInvalid, "%s: %v", itx.TypeProcessorRevived, err)
	}
	slug, ok := p["processorSlug"].(string)
	if !ok {
		return "", itx.Errorf(itx.EInvalid, "%s: processorSlug must be a string", itx.TypeProcessorRevived)
	}
	return slug, nil
}

// namedSubscription trims a name a verb addresses a subscription (or reader) by; a blank one is
// bad input, not a name that is gone: nothing can hold it.
func namedSubscription(name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		return "", itx.Errorf(itx.EInvalid, "subscription name must not be empty")
	}
	return name, nil
}

func (st *coreState) existing(name string) (*catalogEntry, error) {
	name, err := namedSubscription(name)
	if err != nil {
		return nil, err
	}
	entry := st.Subscriptions[name]
	if entry == nil {
		return nil, itx.Errorf(itx.ENotFound, "subscription %q does not exist", name)
	}
	return entry, nil
}

func (st *coreState) reduceConfigured(e *itx.Event, rc *reduceContext) ([]cursorEffect, error) {
	cfg, err := itx.ParseSubscriptionConfig(e.Payload)
	if err != nil {
		return nil, err
	}
	if rc.authority != authCore {
		if err := itx.CheckNewSubscriptionConfig(cfg); err != nil {
			return nil, err
		}
	}
	if rc.authority == authClient {
		// A name given blank is 0 characters after trimming: refused (seed 000: 1-500), not taken
		// for a name left out. History is replayed as it was accepted.
		var given struct {
			Name *string `json:"name"`
		}
		if json.Unmarshal(e.Payload, &given) == nil && given.Name != nil && cfg.Name == "" {
			return nil, itx.Errorf(itx.EInvalid, "subscription name %q is blank: leave it out for a generated name", *given.Name)
		}
	}
	name := cfg.Name
	if name == "" {
		name = fmt.Sprintf("%s%d", itx.GeneratedNamePrefix, e.Offset)
	} else if strings.HasPrefix(name, itx.GeneratedNamePrefix) && st.Subscriptions[name] == nil {
		return nil, itx.Errorf(itx.EInvalid, "subscription name %q uses the generated-name namespace but names no existing subscription", name)
	}
	cfg.Name = name
	r := &cfg.Receiver
	if cfg.Filter != nil && cfg.Filter.JSONataCondition != "" {
		if err := rc.compile(cfg.Filter.JSONataCondition); err != nil {
			return nil, err
		}
	}
	if r.JSONataTransform != "" {
		if err := rc.compile(r.JSONataTransform); err != nil {
			return nil, err
		}
	}
	if r.EffectiveDelivery().DeadLetterPath == rc.path {
		return nil, itx.Errorf(itx.EInvalid, "a subscription cannot dead-letter into its own stream")
	}
	if rc.authority != authCore {
		// Its copies and dead letters would be a client's writes into the audit stream.
		targets := []string{r.EffectiveDelivery().DeadLetterPath}
		if r.Action == itx.KindCopyToStream {
			targets = append(targets, r.ReceivingStreamPath)
		}
		for _, target := range targets {
			if err := serverWritten(StreamRef{ProjectID: rc.projectID, Path: target}); err != nil {
				return nil, err
			}
		}
	}
	switch r.Action {
	case itx.KindWebhookPost:
		if rc.checkURL != nil {
			if err := rc.checkURL(r.URL); err != nil {
				return nil, err
			}
		}
	case itx.KindCopyToStream:
		if r.ReceivingStreamPath == rc.path {
			return nil, itx.Errorf(itx.EInvalid, "a stream cannot copy events into itself")
		}
		n := 0
		for other, entry := range st.Subscriptions {
			if other != name && entry.Kind() == itx.KindCopyToStream && entry.Config.Receiver.ReceivingStreamPath == r.ReceivingStreamPath {
				n++
			}
		}
		if n >= itx.MaxCopySubscriptionsPerTarget {
			return nil, itx.Errorf(itx.ELimitExceeded, "a stream may configure at most %d subscriptions copying into one receiving stream", itx.MaxCopySubscriptionsPerTarget)
		}
	}
	prev := st.Subscriptions[name]
	if prev != nil && sameConfig(*cfg, prev.Config, false) {
		// The same config again, written because it came with a new idempotency key (the key
		// must be kept): nothing changes, not the epoch, not the cursor, not a halt.
		return nil, nil
	}
	if rc.maxConfigBytes > 0 && len(e.Payload) > rc.maxConfigBytes {
		return nil, itx.Errorf(itx.ETooLarge, "a subscription's config is at most %d bytes (--max-subscription-config-bytes), this one is %d", rc.maxConfigBytes, len(e.Payload))
	}
	if prev == nil && rc.nameTaken != nil {
		if what := rc.nameTaken(name); what != "" {
			return nil, itx.Errorf(itx.EFailedPrecondition, "%q names %s of this stream: subscriptions, connection keys and reader names share one name space", name, what)
		}
	}
	if prev == nil && len(st.Subscriptions) >= rc.maxSubs {
		return nil, itx.Errorf(itx.ELimitExceeded, "a stream may have at most %d subscriptions (--max-subscriptions-per-stream)", rc.maxSubs)
	}
	if prev != nil && !newStart(prev, cfg) {
		// A changed config is a new occupant of the name: a new birth (and seek) epoch, so
		// nothing the old receiver still acknowledges lands; a halt or a park is cleared (a
		// fresh configure is, besides resume, the way back) and the retry state starts over.
		// The cursor stays: the events still owed go to the new receiver, none twice by design.
		prev.Config, prev.ReconfiguredAtOffset = *cfg, e.Offset
		prev.ConfiguredAtOffset, prev.ConfiguredAt, prev.Halted = e.Offset, e.CreatedAt, nil
		return []cursorEffect{{kind: effectReconfigure, name: name, epoch: e.Offset}}, nil
	}
	// A new subscription, or a change that asks for a new start: a new birth epoch, a fresh
	// cursor at the start position, any halt cleared.
	occupied := e.Offset
	if prev != nil {
		occupied = prev.OccupiedAtOffset
	}
	st.Subscriptions[name] = &catalogEntry{Config: *cfg, ConfiguredAtOffset: e.Offset, ConfiguredAt: e.CreatedAt, OccupiedAtOffset: occupied}
	initial := int64(0)
	if r.Action != itx.KindProcessorWake && r.EffectiveDelivery().Start == itx.StartNow {
		initial = e.Offset
	}
	// A new start over a processor-wake subscription (another kind now), or one that makes a
	// processor of another kind, is a new occupant of the name: the processor it replaces ends
	// exactly as at a removal (its progress, KV and alarm forgotten, its views told), so a
	// processor configured again later starts from nothing, not from records that missed
	// every event delivered meanwhile. (A change of placement or contract keeps the kind: a
	// reconfigure, which keeps the processor's records.)
	retire := prev != nil && (prev.Kind() == itx.KindProcessorWake || r.Action == itx.KindProcessorWake)
	return []cursorEffect{{kind: effectBorn, name: name, offset: initial, epoch: e.Offset, retire: retire}}, nil
}

// canonicalConfig spells out the defaults, so a config that states them equals one that omits them.
// A processor-wake receiver has no delivery policy (validation refuses one); its defaults are its
// placement (in-process: left out, "in-process" and the seed's "facet" say the same) and its
// contract (the subscription's name: left out or named says the same).
//
// With controls, maxDeliveryEvents and maxDeliveryBytes left at 0 take the receiver kind's
// default too, so stating the default says the same. Only the planner's identicalConfigure
// spells them out: the reduction compares them as written, as every checkpoint of
// CoreStateVersion 1 was reduced (a configure that states them, written because it came with an
// idempotency key, still takes a new epoch there), so that changing this did not change what
// reduce computes from a log.
//
// A filter's event types are a set: their order and repeats say nothing, and a list holding "*"
// passes every type, as no filter does.
func canonicalConfig(c itx.SubscriptionConfig, controls bool) itx.SubscriptionConfig {
	if f := c.Filter; f != nil {
		types := slices.Clone(f.EventTypes)
		slices.Sort(types)
		types = slices.Compact(types)
		if slices.Contains(types, "*") || len(types) == 0 {
			types = nil
		}
		c.Filter = &itx.SubscriptionFilter{EventTypes: types, JSONataCondition: f.JSONataCondition}
		if types == nil && f.JSONataCondition == "" {
			c.Filter = nil
		}
	}
	if c.Receiver.Action == itx.KindProcessorWake {
		if p := c.Receiver.Placement; p == "" || p == itx.PlacementFacet {
			c.Receiver.Placement = itx.PlacementInProcess
		}
		if c.Receiver.Processor == "" {
			c.Receiver.Processor = c.Name
		}
		return c
	}
	d := c.Receiver.EffectiveDelivery()
	c.Receiver.Delivery = &d
	if controls {
		// The delivery controls' 0 is the kind's default (one event for a webhook, whose body
		// keeps its single-event shape at one), so stating that default is the same config.
		c.MaxDeliveryEvents, c.MaxDeliveryBytes = c.BatchLimits()
	}
	return c
}

// isSubscriptionControl reports the event types an operator steers subscriptions with: the
// circuit breaker never refuses them, so a runaway subscription can always be removed.
func isSubscriptionControl(typ string) bool {
	switch typ {
	case itx.TypeSubscriptionConfigured, itx.TypeSubscriptionCursorSet, itx.TypeSubscriptionResumed, itx.TypeSubscriptionRemoved:
		return true
	}
	return false
}

// newStart reports whether a changed config asks for a new birth: another receiver kind, or
// another start position.
func newStart(prev *catalogEntry, cfg *itx.SubscriptionConfig) bool {
	return prev.Kind() != cfg.Receiver.Action ||
		prev.Config.Receiver.EffectiveDelivery().Start != cfg.Receiver.EffectiveDelivery().Start
}

// identicalConfigure returns the subscription an event would configure if it names an existing
// subscription with exactly its config: such a configure appends nothing and answers with the
// event that set that config (a service that ensures its subscription at every boot loses
// nothing). Nil otherwise, including when the payload is invalid (reduce then says why). The
// planner asks only for a configure without an idempotency key: a keyed one is written (inert),
// so its key is kept and a later event cannot take it.
func (st *coreState) identicalConfigure(in *itx.EventInput) *catalogEntry {
	if in.Type != itx.TypeSubscriptionConfigured || len(in.Provenance) > 0 {
		return nil
	}
	cfg, err := itx.ParseSubscriptionConfig(in.Payload)
	if err != nil || cfg.Name == "" {
		return nil
	}
	entry := st.Subscriptions[cfg.Name]
	if entry == nil {
		return nil
	}
	if !sameConfig(*cfg, entry.Config, true) {
		return nil
	}
	return entry
}

// sameConfig reports whether two configs say the same once their defaults are spelled out (the
// delivery controls' too with controls: see canonicalConfig).
func sameConfig(x, y itx.SubscriptionConfig, controls bool) bool {
	a, err1 := json.Marshal(canonicalConfig(x, controls))
	b, err2 := json.Marshal(canonicalConfig(y, controls))
	return err1 == nil && err2 == nil && string(a) == string(b)
}

// acceptCopy checks and records a copy batch's stamp against the inbound fence of its
// (source path, subscription name). A stale stamp can never land.
func (st *coreState) acceptCopy(stamp *copyStamp, events int, offsets []int64, at int64) error {
	if st.Inbound == nil {
		st.Inbound = map[string]map[string]*inboundRecord{}
	}
	byName := st.Inbound[stamp.SourcePath]
	if byName == nil {
		byName = map[string]*inboundRecord{}
		st.Inbound[stamp.SourcePath] = byName
	}
	rec := byName[stamp.Name]
	if rec != nil && rec.StreamID == stamp.StreamID && stamp.CursorChangedAtOffset < rec.CursorChangedAtOffset {
		return itx.Errorf(itx.EFailedPrecondition,
			"copy from %s subscription %q is stale (seek epoch %d, this stream already accepted %d)",
			stamp.SourcePath, stamp.Name, stamp.CursorChangedAtOffset, rec.CursorChangedAtOffset)
	}
	if rec == nil || rec.StreamID != stamp.StreamID || rec.CursorChangedAtOffset != stamp.CursorChangedAtOffset {
		rec = &inboundRecord{StreamID: stamp.StreamID, CursorChangedAtOffset: stamp.CursorChangedAtOffset}
		byName[stamp.Name] = rec
	}
	rec.EventsReceived += int64(events)
	rec.LastEventReceivedAt = at
	if stamp.Acking {
		rec.AckedThrough = max(rec.AckedThrough, stamp.Confirmed)
		for _, o := range offsets {
			if o > rec.AckedThrough && !slices.Contains(rec.Lettered, o) {
				rec.Lettered = append(rec.Lettered, o)
			}
		}
		rec.Lettered = slices.DeleteFunc(rec.Lettered, func(o int64) bool { return o <= rec.AckedThrough })
		slices.Sort(rec.Lettered)
		if n := len(rec.Lettered); n > maxLetteredOffsets {
			rec.Lettered = slices.Clone(rec.Lettered[n-maxLetteredOffsets:])
		}
	} else {
		for _, o := range offsets {
			rec.Through = max(rec.Through, o)
		}
	}
	st.trimInbound()
	return nil
}

// tookAlready reports whether the source event at offset, copied or dead-lettered under stamp,
// is in this stream already, or was until a trim deleted it (and its idempotency key with it): a
// redelivery after a lost acknowledgement must not land it again.
func (st *coreState) tookAlready(stamp *copyStamp, offset int64) bool {
	if !stamp.Acking {
		return offset <= st.copiedThrough(stamp)
	}
	rec := st.Inbound[stamp.SourcePath][stamp.Name]
	if rec == nil || rec.StreamID != stamp.StreamID || rec.CursorChangedAtOffset != stamp.CursorChangedAtOffset {
		return false
	}
	_, found := slices.BinarySearch(rec.Lettered, offset)
	return offset <= rec.AckedThrough || found
}

// copiedThrough is the highest source offset copied under stamp's (source stream, subscription,
// seek epoch), 0 when not known. Copies arrive in source offset order, so every source event at or
// below it that the subscription copies is in this stream already, or was until a trim deleted it
// (and its idempotency key with it): a redelivery after a lost acknowledgement must not land it
// again.
func (st *coreState) copiedThrough(stamp *copyStamp) int64 {
	rec := st.Inbound[stamp.SourcePath][stamp.Name]
	if rec == nil || rec.StreamID != stamp.StreamID || rec.CursorChangedAtOffset != stamp.CursorChangedAtOffset {
		return 0
	}
	return rec.Through
}

// trimInbound keeps at most MaxInboundSourceRecords, evicting the least recently used.
func (st *coreState) trimInbound() {
	evictLeastRecent(st.Inbound, itx.MaxInboundSourceRecords, func(r *inboundRecord) int64 { return r.LastEventReceivedAt })
}

// evictLeastRecent keeps at most bound records of m (source path -> name -> record), deleting
// those least recently used (lowest at, then by path and name), and a path left without any.
func evictLeastRecent[R any](m map[string]map[string]R, bound int, at func(R) int64) {
	type key struct{ path, name string }
	var all []key
	for p, byName := range m {
		for n := range byName {
			all = append(all, key{p, n})
		}
	}
	if len(all) <= bound {
		return
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := at(m[all[i].path][all[i].name]), at(m[all[j].path][all[j].name])
		if a != b {
			return a < b
		}
		return all[i].path+"\x00"+all[i].name < all[j].path+"\x00"+all[j].name
	})
	for _, k := range all[:len(all)-bound] {
		delete(m[k.path], k.name)
		if len(m[k.path]) == 0 {
			delete(m, k.path)
		}
	}
}

// copyStamp identifies a copy batch: its source and the source subscription's epochs.
type copyStamp struct {
	SourcePath            string
	Name                  string
	StreamID              string
	CursorChangedAtOffset int64
	// Acking: a dead letter of an offset-acking subscription, whose confirmed cursor was
	// Confirmed when the letter's try was read (see inboundRecord.AckedThrough).
	Acking    bool
	Confirmed int64
}

// decodeCoreState reads a core-state checkpoint; false when there is none, it does not decode,
// or it is from another CoreStateVersion (then the log is re-reduced).
func decodeCoreState(raw []byte) (*coreState, bool) {
	var st coreState
	if raw == nil || json.Unmarshal(raw, &st) != nil || st.Version != CoreStateVersion {
		return nil, false
	}
	if st.Subscriptions == nil {
		st.Subscriptions = map[string]*catalogEntry{}
	}
	return &st, true
}
