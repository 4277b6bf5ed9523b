package itx

import (
	"encoding/json"
	"net/url"
	"strings"
)

// Redacted stands in for a webhook's credential wherever someone who does not manage the
// stream's subscriptions would read one: a header value, a URL's userinfo or a query value.
const Redacted = "(redacted)"

// redactedURLPart stands in for a URL's userinfo and query values: a word that needs no escaping.
const redactedURLPart = "redacted"

// A webhook's URL and headers are recorded in its configured event as given, and a receiver
// often takes its credential there (an Authorization header, a token in the query, user:password
// in the URL). Only the admin right reads them as stored; everyone else (a read-only token, a
// subscription's receiver, the record of a skipped event) reads them redacted. Header names, the
// URL's scheme, host, path and query keys stay: what the subscription does stays readable.

// RedactURL is a webhook URL with its userinfo and each query value replaced by "redacted" (a
// URL that does not parse: Redacted whole). The fragment is dropped: it is never sent.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return Redacted
	}
	if u.User == nil && u.RawQuery == "" && u.Fragment == "" && u.Opaque == "" {
		return raw
	}
	if u.Opaque != "" { // "https:user:pass@host": nothing of it is a plain path
		return Redacted
	}
	if u.User != nil {
		u.User = url.User(redactedURLPart)
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			u.RawQuery = redactedURLPart
		} else {
			for k, vs := range q {
				for i := range vs {
					vs[i] = redactedURLPart
				}
				q[k] = vs
			}
			u.RawQuery = q.Encode()
		}
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// RedactedReceiver is r as read without the admin right: its header values and its URL's
// credentials redacted. r is not written (its Headers map may be shared).
func RedactedReceiver(r Receiver) Receiver {
	if r.URL != "" {
		r.URL = RedactURL(r.URL)
	}
	if len(r.Headers) > 0 {
		h := make(map[string]string, len(r.Headers))
		for k := range r.Headers {
			h[k] = Redacted
		}
		r.Headers = h
	}
	return r
}

// RedactedEvents returns events with their webhook credentials redacted (RedactedEvent). The
// slice is copied only when an event changes: events may be shared and are never written.
func RedactedEvents(events []Event) []Event { return viewEvents(events, RedactedEvent) }

// RedactedEvent is e with the webhook credentials it records redacted, and whether that differs:
// a configured event's receiver (its URL, header values, and a signing secret a config written
// before secrets were kept apart holds itself), and a dead letter's skipped event.
func RedactedEvent(e Event) (Event, bool) {
	var p json.RawMessage
	var changed bool
	switch e.Type {
	case TypeSubscriptionConfigured:
		p, changed = redactConfigured(e.Payload)
	case TypeDeadLetter:
		p, changed = redactDeadLetter(e.Payload)
	}
	if changed {
		e.Payload = p
	}
	return e, changed
}

// redactConfigured redacts a configured payload's receiver. Fields match case-insensitively when
// a config is decoded: every spelling is redacted.
func redactConfigured(payload json.RawMessage) (json.RawMessage, bool) {
	var cfg map[string]any
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if dec.Decode(&cfg) != nil {
		return payload, false
	}
	changed := false
	for _, r := range foldedObjects(cfg, "receiver") {
		for k, val := range r {
			switch {
			case strings.EqualFold(k, "url"):
				if s, ok := val.(string); ok {
					if red := RedactURL(strings.TrimSpace(s)); red != strings.TrimSpace(s) {
						r[k], changed = red, true
					}
				}
			case strings.EqualFold(k, "secret"):
				// A config written before secrets were kept apart holds the secret itself.
				if sec, ok := val.(string); ok && sec != "" && !IsSecretRef(strings.TrimSpace(sec)) && sec != Redacted {
					r[k], changed = Redacted, true
				}
			case strings.EqualFold(k, "headers"):
				h, ok := val.(map[string]any)
				if !ok {
					continue
				}
				for name, v := range h {
					if v != Redacted {
						h[name], changed = Redacted, true
					}
				}
			}
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

// redactDeadLetter redacts the skipped event a dead letter carries.
func redactDeadLetter(payload json.RawMessage) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(payload, &m) != nil || !viewLetterEvent(m, RedactedEvent) {
		return payload, false
	}
	out, err := json.Marshal(m)
	if err != nil {
		return payload, false
	}
	return out, true
}
