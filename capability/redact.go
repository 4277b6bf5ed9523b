package capability

import "github.com/itx-dev/itx"

// Events are read under the capability's prefix (itx.ScopedEvents): a session limited to a
// prefix reads the paths of streams outside it as itx.OutsideScope.

// redactEvents returns events as this access may read them.
func (a access) redactEvents(events []itx.Event) []itx.Event {
	return itx.ScopedEvents(a.prefix, events)
}

// redactEvent is one event as this access may read it, and whether that differs.
func (a access) redactEvent(e itx.Event) (itx.Event, bool) { return itx.ScopedEvent(a.prefix, e) }

// viewEvent is how this access reads one event, nil when it reads events as stored.
func (a access) viewEvent() func(itx.Event) itx.Event {
	if a.prefix == "" || a.prefix == "/" {
		return nil
	}
	return func(e itx.Event) itx.Event { e, _ = a.redactEvent(e); return e }
}
