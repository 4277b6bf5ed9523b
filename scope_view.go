package itx

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
)

// OutsideScope stands in for a stream path outside a scope's prefix wherever an event read
// under that scope would otherwise show one (a copy-to-stream target, a copied event's source):
// a session, or a subscription configured by one, limited to a prefix learns nothing of the
// streams outside it. It is not a valid path.
const OutsideScope = "(outside this token's scope)"

// A stream inside a prefix can hold what names streams outside it, written there by a wider
// token or by the server for one: a copy-to-stream subscription's configured event (its target),
// copied events (their provenance, and the server's idempotency key of a copy, which names the
// source), and the record of a dropped copy. Read under the prefix (ScopedEvents), those paths
// read as OutsideScope and a copy's key as its hashed form; nothing stored changes.

// ScopedEvents returns events as read under the path prefix ("" or "/": as stored). The slice
// is copied only when an event changes: events may be shared and are never written.
func ScopedEvents(prefix string, events []Event) []Event {
	if prefix == "" || prefix == "/" {
		return events
	}
	return viewEvents(events, func(e Event) (Event, bool) { return ScopedEvent(prefix, e) })
}

// viewEvents returns events as view reads each, copying the slice only when an event changes:
// events may be shared and are never written.
func viewEvents(events []Event, view func(Event) (Event, bool)) []Event {
	var out []Event
	for i := range events {
		e, changed := view(events[i])
		if !changed {
			continue
		}
		if out == nil {
			out = append([]Event(nil), events...)
		}
		out[i] = e
	}
	if out == nil {
		return events
	}
	return out
}

// ScopedEvent is one event as read under the path prefix, and whether that differs.
func ScopedEvent(prefix string, e Event) (Event, bool) {
	if prefix == "" || prefix == "/" {
		return e, false
	}
	v := scopeView(prefix)
	changed := false
	for i, h := range e.Provenance {
		if v.shown(h.Path) == h.Path {
			continue
		}
		if !changed {
			e.Provenance = append([]Hop(nil), e.Provenance...)
			changed = true
		}
		// The hop keeps only what the copy itself says: the source event's type.
		e.Provenance[i] = Hop{Path: OutsideScope, Type: h.Type}
	}
	if k, ok := v.key(e.IdempotencyKey); ok {
		e.IdempotencyKey, changed = k, true
	}
	switch e.Type {
	case TypeSubscriptionConfigured:
		if p, ok := v.configured(e.Payload); ok {
			e.Payload, changed = p, true
		}
	case TypeErrorOccurred:
		if p, ok := v.message(e.Payload); ok {
			e.Payload, changed = p, true
		}
	case TypeDeadLetter:
		if p, ok := v.deadLetter(e.Payload); ok {
			e.Payload, changed = p, true
		}
	}
	return e, changed
}

// scopeView reads events under a prefix.
type scopeView string

// shown is path as read under the prefix: itself when inside it, OutsideScope when not.
func (v scopeView) shown(path string) string {
	if path == "" || PathUnder(path, string(v)) {
		return path
	}
	return OutsideScope
}

// quotedPath finds the JSON-quoted stream paths in a server-written text (a copy's idempotency
// key, a dropped copy's message).
var quotedPath = regexp.MustCompile(`(\\?")(/[^"\\]*)(\\?")`)

// hides reports whether text quotes a stream path outside the prefix.
func (v scopeView) hides(text string) bool {
	for _, m := range quotedPath.FindAllStringSubmatch(text, -1) {
		if ValidatePath(m[2]) == nil && v.shown(m[2]) != m[2] {
			return true
		}
	}
	return false
}

// key replaces a server-written idempotency key that names a stream outside the prefix (a
// copy's: subscription, epoch, project, source path, ...) by its hashed form, the form the
// server itself gives a key too long to spell out: stable, and naming nothing.
func (v scopeView) key(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, InternalKeyPrefix)
	if !ok || !v.hides(rest) {
		return key, false
	}
	kind, ident, ok := strings.Cut(rest, ":")
	if !ok {
		return key, false
	}
	sum := sha256.Sum256([]byte(ident))
	return InternalKeyPrefix + kind + "#sha256:" + hex.EncodeToString(sum[:]), true
}

// configured hides a copy-to-stream target and a dead-letter stream outside the prefix in a
// configured event.
func (v scopeView) configured(payload json.RawMessage) (json.RawMessage, bool) {
	var cfg map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if dec.Decode(&cfg) != nil {
		return payload, false
	}
	// Fields match case-insensitively when a config is decoded: every spelling is hidden.
	changed := false
	hide := func(m map[string]any, field string) {
		for k, val := range m {
			path, _ := val.(string)
			if path = strings.TrimSpace(path); strings.EqualFold(k, field) && path != "" && v.shown(path) != path {
				m[k], changed = OutsideScope, true
			}
		}
	}
	for _, r := range foldedObjects(cfg, "receiver") {
		hide(r, "receivingStreamPath")
		// A dead-letter stream is written into as a copy's target is.
		for _, d := range foldedObjects(r, "delivery") {
			hide(d, "deadLetterPath")
		}
	}
	if !changed {
		return payload, false
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return payload, false
	}
	return b, true
}

// foldedObjects are the object values of m under every spelling of field.
func foldedObjects(m map[string]any, field string) []map[string]any {
	var out []map[string]any
	for k, val := range m {
		if o, ok := val.(map[string]any); ok && strings.EqualFold(k, field) {
			out = append(out, o)
		}
	}
	return out
}

// message hides the quoted paths outside the prefix in a stream/error-occurred message (a
// dropped copy names its source stream).
func (v scopeView) message(payload json.RawMessage) (json.RawMessage, bool) {
	if !v.hides(string(payload)) {
		return payload, false
	}
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return payload, false
	}
	msg, _ := m["message"].(string)
	m["message"] = v.text(msg)
	b, err := json.Marshal(m)
	if err != nil {
		return payload, false
	}
	return b, true
}

// text is a server-written text with its quoted paths outside the prefix replaced.
func (v scopeView) text(msg string) string {
	return quotedPath.ReplaceAllStringFunc(msg, func(q string) string {
		sub := quotedPath.FindStringSubmatch(q)
		if ValidatePath(sub[2]) == nil && v.shown(sub[2]) != sub[2] {
			return sub[1] + OutsideScope + sub[3]
		}
		return q
	})
}

// viewLetterEvent replaces the skipped event a dead letter (m, its decoded payload) carries with
// that event as view reads it, and reports whether it did.
func viewLetterEvent(m map[string]json.RawMessage, view func(Event) (Event, bool)) bool {
	var event Event
	raw, ok := m["event"]
	if !ok || json.Unmarshal(raw, &event) != nil {
		return false
	}
	shown, changed := view(event)
	if !changed {
		return false
	}
	b, err := json.Marshal(shown)
	if err != nil {
		return false
	}
	m["event"] = b
	return true
}

// deadLetter hides what names a stream outside the prefix in a dead letter (DeadLetterPayload):
// a source stream outside it (its path and id), the skipped event as read under the prefix, and
// quoted paths in its error. A wider token's subscription outside the prefix may dead-letter
// into a stream inside it; the letter then reads as a copy from outside does.
func (v scopeView) deadLetter(payload json.RawMessage) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(payload, &m) != nil {
		return payload, false
	}
	changed := false
	var path, msg string
	if json.Unmarshal(m["path"], &path) == nil && path != "" && v.shown(path) != path {
		m["path"], _ = json.Marshal(OutsideScope)
		delete(m, "streamId")
		changed = true
	}
	if viewLetterEvent(m, func(e Event) (Event, bool) { return ScopedEvent(string(v), e) }) {
		changed = true
	}
	if json.Unmarshal(m["error"], &msg) == nil && v.hides(msg) {
		m["error"], _ = json.Marshal(v.text(msg))
		changed = true
	}
	if !changed {
		return payload, false
	}
	b, err := json.Marshal(m)
	if err != nil {
		return payload, false
	}
	return b, true
}
