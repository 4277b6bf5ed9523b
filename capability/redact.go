package capability

import "github.com/itx-dev/itx"

// Events are read under the capability's prefix (itx.ScopedEvents): a session limited to a
// prefix reads the paths of streams outside it as itx.OutsideScope. Without the admin right it
// reads webhooks' credentials (header values, a URL's userinfo and query values) redacted
// (itx.RedactedEvents): they are the stream administrator's.

// redactEvents returns events as this access may read them.
func (a access) redactEvents(events []itx.Event) []itx.Event {
	events = itx.ScopedEvents(a.prefix, events)
	if a.rights&rAdmin == 0 {
		events = itx.RedactedEvents(events)
	}
	return events
}

// redactEvent is one event as this access may read it, and whether that differs.
func (a access) redactEvent(e itx.Event) (itx.Event, bool) {
	e, changed := itx.ScopedEvent(a.prefix, e)
	if a.rights&rAdmin == 0 {
		var c bool
		e, c = itx.RedactedEvent(e)
		changed = changed || c
	}
	return e, changed
}

// viewEvent is how this access reads one event, nil when it reads events as stored.
func (a access) viewEvent() func(itx.Event) itx.Event {
	if (a.prefix == "" || a.prefix == "/") && a.rights&rAdmin != 0 {
		return nil
	}
	return func(e itx.Event) itx.Event { e, _ = a.redactEvent(e); return e }
}

// redactReceiver is a subscription's receiver as this access may read it.
func (a access) redactReceiver(r itx.Receiver) itx.Receiver {
	if a.rights&rAdmin == 0 {
		return itx.RedactedReceiver(r)
	}
	return r
}
