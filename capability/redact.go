package capability

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/itx-dev/itx"
)

// A stream inside a prefix can hold what names streams outside it, written there by a wider
// token or by the server for one: a copy-to-stream subscription's configured event (its target),
// copied events (their provenance, and the server's idempotency key of a copy, which names the
// source), and the record of a dropped copy. A session limited to the prefix reads these events
// with those paths replaced by OutsideScope (and a copy's key by its hashed form), so it learns
// of no stream outside its prefix; nothing stored changes. Sessions without a prefix read the
// events as stored.

// redactEvents returns events as this access may read them. The slice is copied only when an
// event changes: events may be shared (a stream's recent commit) and are never written.
func (a access) redactEvents(events []itx.Event) []itx.Event {
	if a.prefix == "" || a.prefix == "/" {
		return events
	}
	var out []itx.Event
	for i := range events {
		e, changed := a.redactEvent(events[i])
		if !changed {
			continue
		}
		if out == nil {
			out = append([]itx.Event(nil), events...)
		}
		out[i] = e
	}
	if out == nil {
		return events
	}
	return out
}

// viewEvent is how this access reads one event, nil when it reads events as stored.
func (a access) viewEvent() func(itx.Event) itx.Event {
	if a.prefix == "" || a.prefix == "/" {
		return nil
	}
	return func(e itx.Event) itx.Event { e, _ = a.redactEvent(e); return e }
}

// redactEvent is one event as this access may read it, and whether that differs.
func (a access) redactEvent(e itx.Event) (itx.Event, bool) {
	changed := false
	for i, h := range e.Provenance {
		if a.shown(h.Path) == h.Path {
			continue
		}
		if !changed {
			e.Provenance = append([]itx.Hop(nil), e.Provenance...)
			changed = true
		}
		// The hop keeps only what the copy itself says: the source event's type.
		e.Provenance[i] = itx.Hop{Path: OutsideScope, Type: h.Type}
	}
	if k, ok := a.redactKey(e.IdempotencyKey); ok {
		e.IdempotencyKey, changed = k, true
	}
	switch e.Type {
	case itx.TypeSubscriptionConfigured:
		if p, ok := a.redactConfigured(e.Payload); ok {
			e.Payload, changed = p, true
		}
	case itx.TypeErrorOccurred:
		if p, ok := a.redactMessage(e.Payload); ok {
			e.Payload, changed = p, true
		}
	}
	return e, changed
}

// quotedPath finds the JSON-quoted stream paths in a server-written text (a copy's idempotency
// key, a dropped copy's message).
var quotedPath = regexp.MustCompile(`(\\?")(/[^"\\]*)(\\?")`)

// hidesPath reports whether text quotes a stream path outside the prefix.
func (a access) hidesPath(text string) bool {
	for _, m := range quotedPath.FindAllStringSubmatch(text, -1) {
		if itx.ValidatePath(m[2]) == nil && a.shown(m[2]) != m[2] {
			return true
		}
	}
	return false
}

// redactKey replaces a server-written idempotency key that names a stream outside the prefix
// (a copy's: subscription, epoch, project, source path, ...) by its hashed form, the form the
// server itself gives a key too long to spell out: stable, and naming nothing.
func (a access) redactKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, itx.InternalKeyPrefix)
	if !ok || !a.hidesPath(rest) {
		return key, false
	}
	kind, ident, ok := strings.Cut(rest, ":")
	if !ok {
		return key, false
	}
	sum := sha256.Sum256([]byte(ident))
	return itx.InternalKeyPrefix + kind + "#sha256:" + hex.EncodeToString(sum[:]), true
}

// redactConfigured hides a copy-to-stream target outside the prefix in a configured event.
func (a access) redactConfigured(payload json.RawMessage) (json.RawMessage, bool) {
	var cfg map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if dec.Decode(&cfg) != nil {
		return payload, false
	}
	r, _ := cfg["receiver"].(map[string]any)
	path, _ := r["receivingStreamPath"].(string)
	if path == "" || a.shown(strings.TrimSpace(path)) == strings.TrimSpace(path) {
		return payload, false
	}
	r["receivingStreamPath"] = OutsideScope
	b, err := json.Marshal(cfg)
	if err != nil {
		return payload, false
	}
	return b, true
}

// redactMessage hides the quoted paths outside the prefix in a stream/error-occurred message
// (a dropped copy names its source stream).
func (a access) redactMessage(payload json.RawMessage) (json.RawMessage, bool) {
	if !a.hidesPath(string(payload)) {
		return payload, false
	}
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return payload, false
	}
	msg, _ := m["message"].(string)
	m["message"] = quotedPath.ReplaceAllStringFunc(msg, func(q string) string {
		sub := quotedPath.FindStringSubmatch(q)
		if itx.ValidatePath(sub[2]) == nil && a.shown(sub[2]) != sub[2] {
			return sub[1] + OutsideScope + sub[3]
		}
		return q
	})
	b, err := json.Marshal(m)
	if err != nil {
		return payload, false
	}
	return b, true
}
