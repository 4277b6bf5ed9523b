package capability

import (
	"context"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/server"
)

// rightSet is a set of itx rights: what a capability may do.
type rightSet uint8

const (
	rRead rightSet = 1 << iota
	rAppend
	rSubscribe
	rAdmin

	rAll  = rRead | rAppend | rSubscribe | rAdmin
	rNone = rightSet(0)
)

var rightBits = map[itx.Right]rightSet{itx.RightRead: rRead, itx.RightAppend: rAppend, itx.RightSubscribe: rSubscribe, itx.RightAdmin: rAdmin}

func rightsOf(s itx.Scope) rightSet {
	if len(s.Rights) == 0 {
		return rAll
	}
	var out rightSet
	for _, r := range s.Rights {
		out |= rightBits[r]
	}
	return out
}

func (r rightSet) names() []itx.Right {
	var out []itx.Right
	for _, name := range itx.Rights {
		if r&rightBits[name] != 0 {
			out = append(out, name)
		}
	}
	return out
}

// access is what one capability allows: the session it descends from (whose token may be
// revoked or expire), the stream paths it reaches and its rights. A capability derived from
// another (navigation, or an attenuation such as Stream.readOnly) carries at most its parent's.
type access struct {
	session *server.Session // nil: before login (the Gateway)
	prefix  string          // "" or "/": every path
	rights  rightSet
	// reserve holds a large reply back while the connection's replies already exceed its
	// flow-control bounds (see reserveReply); nil: not on a flow-controlled connection.
	reserve func(ctx context.Context, n int64, onWait func()) (release func(), err error)
}

// reserveReply waits until the caller's connection has room for a reply of up to n bytes, and
// holds it until release; onWait (may be nil) runs once before it waits.
func (a access) reserveReply(ctx context.Context, n int64, onWait func()) (release func(), err error) {
	if a.reserve == nil {
		return func() {}, nil
	}
	return a.reserve(ctx, n, onWait)
}

// accessOf is the access a login yields: the token's scope.
func accessOf(x *server.Session) access {
	return access{session: x, prefix: x.Token.Scope.Prefix, rights: rightsOf(x.Token.Scope)}
}

// narrow keeps only the rights in keep.
func (a access) narrow(keep rightSet) access {
	a.rights &= keep
	return a
}

// scope is the access as an itx.Scope (a token created by this caller must fit inside it).
func (a access) scope() itx.Scope {
	s := itx.Scope{Prefix: a.prefix}
	if a.rights != rAll {
		s.Rights = a.rights.names() // never empty here: Admin calls need the admin right
	}
	return s
}

// reaches checks that path is inside the access's prefix. The refusal names the scope, never a
// stream outside it.
// reachesTargets checks that the other streams a subscription config writes into (a copy's
// receiving stream, the dead-letter stream) are inside the scope, and that the access may append:
// such a subscription appends to them on its configurer's behalf, so configuring it takes the
// append right as well as subscribe (a [read, subscribe] token cannot write into a stream by
// way of a copy).
func (a access) reachesTargets(cfg *itx.SubscriptionConfig) error {
	if cfg.Receiver.Action == itx.KindCopyToStream {
		if err := a.appendsTo("a copy-to-stream subscription", strings.TrimSpace(cfg.Receiver.ReceivingStreamPath)); err != nil {
			return err
		}
	}
	if p := strings.TrimSpace(cfg.Receiver.EffectiveDelivery().DeadLetterPath); p != "" {
		return a.appendsTo("a dead-letter stream", p)
	}
	return nil
}

// appendsTo checks that what (a subscription's target) may append to path on this access's behalf.
func (a access) appendsTo(what, path string) error {
	if err := a.reaches(path); err != nil {
		return err
	}
	if a.rights&rAppend == 0 {
		return itx.Errorf(itx.EPermissionDenied, "%s appends to %s: configuring it needs the append right as well as subscribe", what, path)
	}
	return nil
}

func (a access) reaches(path string) error {
	if !itx.PathUnder(path, a.prefix) {
		return itx.Errorf(itx.EPermissionDenied, "this capability is limited to streams under %s", a.prefix)
	}
	return nil
}

// shown is path as this access may see it: itself when inside the prefix, OutsideScope when not.
func (a access) shown(path string) string {
	if path == "" || itx.PathUnder(path, a.prefix) {
		return path
	}
	return itx.OutsideScope
}

// subscriptionScope is the Scope a subscription this access configures records: its prefix,
// or "" for the whole project.
func (a access) subscriptionScope() string {
	if a.prefix == "/" {
		return ""
	}
	return a.prefix
}

// mountScope is the namespace of the Receivers and processor hosts this access mounts, lists and
// unmounts: the scope its subscriptions record, so a subscription reaches only the mounts made
// under the scope it was configured under (a tenant's events never reach another tenant's
// receiver, nor the whole project's; another tenant's host is never handed its streams).
func (a access) mountScope() string { return a.subscriptionScope() }

// listPrefix intersects a Streams.list prefix with the access's: ok is false when the two
// share no path (the listing is empty).
func (a access) listPrefix(prefix string) (string, bool) {
	if a.prefix == "" || a.prefix == "/" {
		return prefix, true
	}
	switch {
	case strings.HasPrefix(a.prefix, prefix): // the request is wider: list the scope
		return a.prefix, true
	case strings.HasPrefix(prefix, a.prefix):
		return prefix, true
	}
	return "", false
}

// methodRights is the scope rule of every method the server serves, by "Interface.method": the
// right a call needs (rNone: navigation, or a method of something the holder already opened).
// Paths are checked where a method names one (Streams.get, Streams.list, a copy-to-stream
// target). guarded refuses a method missing here, and TestMethodRights_CoverSchema fails for a
// schema method without a rule: a new method is denied until someone decides its right.
var methodRights = map[string]rightSet{
	"Gateway.login":   rNone,
	"Gateway.version": rNone,

	"Project.streams":      rNone,
	"Project.capabilities": rNone,
	"Project.processors":   rNone,
	"Project.describe":     rNone,
	"Project.admin":        rAdmin,

	"Streams.get":       rNone, // the path must be inside the prefix
	"Streams.list":      rRead, // filtered to the prefix
	"Streams.diskUsage": rRead, // filtered to the prefix, as list
	// Deleting a stream destroys what every consumer of it reads: the project's administrators'.
	"Streams.remove": rAdmin, // the path must be inside the prefix

	"Stream.append":                rAppend,
	"Stream.getEvents":             rRead,
	"Stream.getEventPage":          rRead,
	"Stream.waitForEvent":          rRead,
	"Stream.describe":              rRead,
	"Stream.subscriptions":         rNone,
	"Stream.setSubscriptionCursor": rSubscribe,
	"Stream.resumeSubscription":    rSubscribe,
	"Stream.openConnection":        rRead,
	"Stream.readers":               rNone,
	"Stream.liveState":             rRead,
	"Stream.readOnly":              rNone, // attenuation: never more than the holder has
	"Stream.appendOnly":            rNone,
	"Stream.schedule":              rAppend,
	"Stream.cancelScheduled":       rAppend,
	"Stream.listScheduled":         rRead,
	"Stream.trim":                  rAdmin, // deletes what every consumer already holds, for good
	"Stream.setRetention":          rAdmin, // trims as it goes

	"Subscriptions.list": rRead,
	"Subscriptions.get":  rNone,
	// Issue 14's rights: subscribe configures subscriptions and mounts receivers (attaching a
	// consumer is what the right grants); a copy or dead-letter target needs append besides.
	"Subscriptions.configure": rSubscribe,
	"Subscriptions.remove":    rSubscribe,

	"Subscription.describe":           rRead,
	"Subscription.waitUntilProcessed": rRead,
	"Subscription.processor":          rRead,
	"Subscription.confirm":            rSubscribe, // moves the cursor, as cursor-set does

	"Connection.close": rNone,
	"Connection.ping":  rNone,
	"Connection.key":   rNone,

	"Handle.cancel": rNone,

	"Capabilities.mount":   rSubscribe,
	"Capabilities.unmount": rSubscribe,
	"Capabilities.list":    rRead,

	// A reader's checkpoint is the reader's own bookkeeping beside its reads; it holds back
	// trims only when registered with subscribe as well (server.ReaderCaller.NoHold).
	"Readers.register": rRead,
	"Readers.list":     rRead,
	"Readers.remove":   rRead,

	"ProcessorHosts.mount": rSubscribe | rRead, // a host reads the streams it is woken for
	"ProcessorHosts.list":  rRead,

	// A remote host's ports (served with each wake): the processor's own records on the stream,
	// under the mounting session's rights.
	"ProcessorPorts.claim":    rSubscribe,
	"ProcessorPorts.commit":   rSubscribe,
	"ProcessorPorts.kvGet":    rSubscribe,
	"ProcessorPorts.kvPut":    rSubscribe,
	"ProcessorPorts.setAlarm": rSubscribe,
	"ProcessorPorts.check":    rSubscribe,
	"ProcessorPorts.kvDelete": rSubscribe,
	// A processor's forward to another stream: the mounting token's append, within its prefix.
	"ProcessorPorts.appendTo": rSubscribe | rAppend,
	"ProcessorPorts.schedule": rSubscribe | rAppend, // the home stream's Stream.schedule

	"Processor.snapshot":        rRead,
	"Processor.getRuntimeState": rRead,
	"Processor.liveState":       rRead,

	"Admin.createProject": rAdmin,
	"Admin.listProjects":  rAdmin,
	"Admin.renameProject": rAdmin,
	"Admin.deleteProject": rAdmin,
	"Admin.createToken":   rAdmin,
	"Admin.listTokens":    rAdmin,
	"Admin.revokeToken":   rAdmin,
	"Admin.backup":        rAdmin,
	// A download hands the caller every project's events and the directory (webhook secrets
	// among it): the read right as well, never to a token that administers without reading.
	"Admin.download": rAdmin | rRead,
}

// clientServed lists the interfaces a client implements and the server only calls: they have no
// scope rule because itxd never serves them.
var clientServed = map[string]bool{"EventSink": true, "Receiver": true, "LiveSubscriber": true, "ProcessorHost": true, "BackupSink": true}

// whileValid derives the context of a call that waits (a barrier): cancelled when the session
// ends (its token revoked or expired), so the wait ends with the session as its pushes do.
// settled, called once the wait returned, stops watching and says whether the session is still
// valid: a barrier never answers what it found after its token was revoked.
func (a access) whileValid(ctx context.Context) (_ context.Context, settled func() error) {
	if a.session == nil {
		return ctx, func() error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	forget := a.session.OnEnd(cancel)
	return ctx, func() error {
		forget()
		cancel()
		return a.session.Check()
	}
}

// check decides one call: the session still valid, then the method's right.
func (a access) check(method string) error {
	need, ok := methodRights[method]
	if !ok {
		return itx.Errorf(itx.EPermissionDenied, "%s has no access rule on this server", method)
	}
	if a.session != nil {
		if err := a.session.Check(); err != nil {
			return err
		}
	}
	if a.rights&need != need {
		var missing []string
		for _, r := range (need &^ a.rights).names() {
			missing = append(missing, string(r))
		}
		return itx.Errorf(itx.EPermissionDenied, "%s needs the %s right, which this capability does not carry", method, strings.Join(missing, " and "))
	}
	return nil
}
