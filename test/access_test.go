package test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/schemas"
	capschema "capnproto.org/go/capnp/v3/std/capnp/schema"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// quietSink is an EventSink and a LiveSubscriber that accepts everything.
type quietSink struct{}

func (quietSink) Deliver(context.Context, schema.EventSink_deliver) error { return nil }
func (quietSink) Closed(context.Context, schema.EventSink_closed) error   { return nil }
func (quietSink) State(context.Context, schema.EventSink_state) error     { return nil }

// quietLive is a LiveSubscriber that takes every frame and says nothing.
type quietLive struct{}

func (quietLive) Snapshot(context.Context, schema.LiveSubscriber_snapshot) error { return nil }
func (quietLive) Patch(context.Context, schema.LiveSubscriber_patch) error       { return nil }
func (quietLive) Closed(context.Context, schema.LiveSubscriber_closed) error     { return nil }

// struct0 waits for a call's answer, keeping only its error.
func struct0[T any](fut interface{ Struct() (T, error) }, release capnp.ReleaseFunc) error {
	defer release()
	_, err := fut.Struct()
	return err
}

// served lists the methods of every interface itxd serves, from the schema the generated code
// embeds (the interfaces clients implement left out).
func served(t *testing.T) []string {
	t.Helper()
	var reg schemas.Registry
	schema.RegisterSchema(&reg)
	data, err := reg.Find(schema.Stream_TypeID)
	require.NoError(t, err)
	msg, err := capnp.Unmarshal(data)
	require.NoError(t, err)
	req, err := capschema.ReadRootCodeGeneratorRequest(msg)
	require.NoError(t, err)
	nodes, err := req.Nodes()
	require.NoError(t, err)
	clientSide := map[string]bool{"EventSink": true, "Receiver": true, "LiveSubscriber": true, "ProcessorHost": true, "BackupSink": true}
	var out []string
	for i := 0; i < nodes.Len(); i++ {
		n := nodes.At(i)
		if n.Which() != capschema.Node_Which_interface {
			continue
		}
		name, err := n.DisplayName()
		require.NoError(t, err)
		name = name[n.DisplayNamePrefixLength():]
		if clientSide[name] {
			continue
		}
		ms, err := n.Interface().Methods()
		require.NoError(t, err)
		for j := 0; j < ms.Len(); j++ {
			m, err := ms.At(j).Name()
			require.NoError(t, err)
			out = append(out, name+"."+m)
		}
	}
	sort.Strings(out)
	return out
}

// methodCase is how the scope test calls one schema method, on the stream at path of a project
// logged in with the token under test.
type methodCase struct {
	// right is the right the call needs, or the capability it is made on needs (a Connection,
	// a live-state Handle: read); "": none.
	right itx.Right
	// andRead: the call needs the read right as well as right (mounting a processor host: it
	// pages the streams it is woken for).
	andRead bool
	// pathed: the call reaches a stream, so from a prefix-scoped token it is refused for a stream
	// outside the prefix.
	pathed bool
	// wholeProject: refused to any prefix-scoped token (it reaches every stream of the project).
	wholeProject bool
	// deploymentOnly: only the deployment root may (a project's admin is refused too).
	deploymentOnly bool
	// unserved: this server does not serve the interface yet (Project.processors, a processor);
	// the call fails (unavailable, or failedPrecondition) whoever makes it. Its rule is checked by the capability package.
	unserved bool
	// viaWake: served only to a mounted processor host, inside a wake (ProcessorPorts), under
	// the mounting session's rights; TestRemote_SecondMountTakesOverAndFencesTheFirst calls them.
	viaWake bool
	call    func(ctx context.Context, p schema.Project, path string) error
}

func getStream(ctx context.Context, p schema.Project, path string) schema.Stream {
	return client.Stream(ctx, p, path)
}

func withStream(f func(ctx context.Context, s schema.Stream) error) func(ctx context.Context, p schema.Project, path string) error {
	return func(ctx context.Context, p schema.Project, path string) error {
		s := getStream(ctx, p, path)
		defer s.Release()
		return f(ctx, s)
	}
}

func withSubs(f func(ctx context.Context, s schema.Subscriptions) error) func(ctx context.Context, p schema.Project, path string) error {
	return withStream(func(ctx context.Context, s schema.Stream) error {
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		return f(ctx, subs)
	})
}

func withReaders(f func(ctx context.Context, r schema.Readers) error) func(ctx context.Context, p schema.Project, path string) error {
	return withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.Readers(ctx, nil)
		defer release()
		r := fut.Readers()
		return f(ctx, r)
	})
}

func withConnection(f func(ctx context.Context, c schema.Connection) error) func(ctx context.Context, p schema.Project, path string) error {
	return withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.OpenConnection(ctx, func(p schema.Stream_openConnection_Params) error {
			if _, err := p.NewOptions(); err != nil {
				return err
			}
			return p.SetSink(schema.EventSink_ServerToClient(quietSink{}))
		})
		defer release()
		res, err := fut.Struct()
		if err != nil {
			return err
		}
		c := res.Connection()
		return f(ctx, c)
	})
}

func withProcessors(f func(ctx context.Context, h schema.ProcessorHosts) error) func(ctx context.Context, p schema.Project, path string) error {
	return func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Processors(ctx, nil)
		defer release()
		return f(ctx, fut.Processors())
	}
}

func withProcessor(f func(ctx context.Context, pr schema.Processor) error) func(ctx context.Context, p schema.Project, path string) error {
	return withStream(func(ctx context.Context, s schema.Stream) error {
		sub := client.Subscription(ctx, s, "sub")
		defer sub.Release()
		fut, release := sub.Processor(ctx, nil)
		defer release()
		return f(ctx, fut.Processor())
	})
}

func withAdmin(f func(ctx context.Context, a schema.Admin) error) func(ctx context.Context, p schema.Project, path string) error {
	return func(ctx context.Context, p schema.Project, _ string) error {
		a := client.Admin(ctx, p)
		defer a.Release()
		return f(ctx, a)
	}
}

// methodCases covers every method itxd serves; TestAccess_ScopeEveryMethod fails for a schema
// method missing here.
var methodCases = map[string]methodCase{
	"Gateway.login": {call: func(ctx context.Context, p schema.Project, _ string) error {
		_, err := client.DescribeProject(ctx, p)
		return err
	}},
	"Gateway.version": {call: func(context.Context, schema.Project, string) error { return nil }}, // called before login below

	"Project.streams": {call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Streams(ctx, nil)
		return struct0[schema.Project_streams_Results](fut, release)
	}},
	"Project.capabilities": {call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Capabilities(ctx, nil)
		return struct0[schema.Project_capabilities_Results](fut, release)
	}},
	"Project.processors": {call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Processors(ctx, nil)
		return struct0[schema.Project_processors_Results](fut, release)
	}},
	"Project.describe": {call: func(ctx context.Context, p schema.Project, _ string) error {
		_, err := client.DescribeProject(ctx, p)
		return err
	}},
	"Project.admin": {right: itx.RightAdmin, call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Admin(ctx, nil)
		return struct0[schema.Project_admin_Results](fut, release)
	}},

	"Streams.get": {pathed: true, call: func(ctx context.Context, p schema.Project, path string) error {
		fut, release := p.Streams(ctx, nil)
		defer release()
		g, rel := fut.Streams().Get(ctx, func(a schema.Streams_get_Params) error { return a.SetPath(path) })
		return struct0[schema.Streams_get_Results](g, rel)
	}},
	"Streams.list": {right: itx.RightRead, call: func(ctx context.Context, p schema.Project, _ string) error {
		_, err := client.ListStreams(ctx, p, "")
		return err
	}},
	"Streams.diskUsage": {right: itx.RightRead, call: func(ctx context.Context, p schema.Project, _ string) error {
		_, err := client.DiskUsage(ctx, p, "")
		return err
	}},
	// Not forced: the streams hold a subscription, so an allowed call is refused and deletes nothing.
	"Streams.remove": {right: itx.RightAdmin, pathed: true, call: func(ctx context.Context, p schema.Project, path string) error {
		_, err := client.DeleteStream(ctx, p, path, false)
		return err
	}},

	"Stream.append": {right: itx.RightAppend, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.Append(ctx, s, []itx.EventInput{ev("note", `{}`)}, itx.AppendOptions{})
		return err
	})},
	"Stream.setRetention": {right: itx.RightAdmin, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		return client.SetRetention(ctx, s, client.Retention{}) // clears a policy none of them has
	})},
	"Stream.trim": {right: itx.RightAdmin, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.Trim(ctx, s, 0) // through 0: deletes nothing
		return err
	})},
	"Stream.schedule": {right: itx.RightAppend, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, _, err := client.Schedule(ctx, s, keyed("note", `{}`, "later"), time.Now().Add(time.Hour))
		return err
	})},
	"Stream.cancelScheduled": {right: itx.RightAppend, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.CancelScheduled(ctx, s, "later")
		return err
	})},
	"Stream.listScheduled": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.ListScheduled(ctx, s)
		return err
	})},
	"Stream.getEvents": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.GetEvents(ctx, s, itx.Query{})
		return err
	})},
	"Stream.getEventPage": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.GetEventPage(ctx, s, itx.Query{})
		return err
	})},
	"Stream.waitForEvent": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.WaitForEvent(ctx, s, itx.Predicate{}, 0, 0) // the stream has an event: at once
		return err
	})},
	"Stream.describe": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.Describe(ctx, s)
		return err
	})},
	"Stream.subscriptions": {pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.Subscriptions(ctx, nil)
		return struct0[schema.Stream_subscriptions_Results](fut, release)
	})},
	"Stream.setSubscriptionCursor": {right: itx.RightSubscribe, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.SetSubscriptionCursor(ctx, s, "sub", 0)
		return err
	})},
	"Stream.resumeSubscription": {right: itx.RightSubscribe, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		_, err := client.ResumeSubscription(ctx, s, "sub") // failedPrecondition: it is not halted
		return err
	})},
	"Stream.openConnection": {right: itx.RightRead, pathed: true, call: withConnection(func(context.Context, schema.Connection) error { return nil })},
	"Stream.readers": {pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.Readers(ctx, nil)
		return struct0[schema.Stream_readers_Results](fut, release)
	})},
	"Stream.liveState": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
			return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(quietLive{}))
		})
		return struct0[schema.Stream_liveState_Results](fut, release)
	})},
	"Stream.readOnly": {pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.ReadOnly(ctx, nil)
		return struct0[schema.Stream_readOnly_Results](fut, release)
	})},
	"Stream.appendOnly": {pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.AppendOnly(ctx, nil)
		return struct0[schema.Stream_appendOnly_Results](fut, release)
	})},

	"Subscriptions.list": {right: itx.RightRead, pathed: true, call: withSubs(func(ctx context.Context, s schema.Subscriptions) error {
		_, err := client.ListSubscriptions(ctx, s)
		return err
	})},
	"Subscriptions.get": {pathed: true, call: withSubs(func(ctx context.Context, s schema.Subscriptions) error {
		fut, release := s.Get(ctx, func(p schema.Subscriptions_get_Params) error { return p.SetName("sub") })
		return struct0[schema.Subscriptions_get_Results](fut, release)
	})},
	"Subscriptions.configure": {right: itx.RightSubscribe, pathed: true, call: withSubs(func(ctx context.Context, s schema.Subscriptions) error {
		_, _, err := client.ConfigureSubscription(ctx, s, client.SubscriptionConfig{Name: "sub",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}})
		return err
	})},
	"Subscriptions.remove": {right: itx.RightSubscribe, pathed: true, call: withSubs(func(ctx context.Context, s schema.Subscriptions) error {
		_, err := client.RemoveSubscription(ctx, s, "no-such-subscription")
		return err
	})},

	"Subscription.describe": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		sub := client.Subscription(ctx, s, "sub")
		defer sub.Release()
		_, err := client.DescribeSubscription(ctx, sub)
		return err
	})},
	"Subscription.waitUntilProcessed": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		sub := client.Subscription(ctx, s, "sub")
		defer sub.Release()
		_, err := client.WaitUntilProcessed(ctx, sub, 0, 0)
		return err
	})},
	"Subscription.confirm": {right: itx.RightSubscribe, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		sub := client.Subscription(ctx, s, "sub")
		defer sub.Release()
		_, err := client.ConfirmSubscription(ctx, sub, 0)
		return err
	})},
	"Subscription.processor": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		sub := client.Subscription(ctx, s, "sub")
		defer sub.Release()
		fut, release := sub.Processor(ctx, nil)
		return struct0[schema.Subscription_processor_Results](fut, release) // failedPrecondition: not processor-wake
	})},

	"Connection.close": {right: itx.RightRead, pathed: true, call: withConnection(func(ctx context.Context, c schema.Connection) error {
		fut, release := c.Close(ctx, nil)
		return struct0[schema.Connection_close_Results](fut, release)
	})},
	"Connection.ping": {right: itx.RightRead, pathed: true, call: withConnection(func(ctx context.Context, c schema.Connection) error {
		fut, release := c.Ping(ctx, nil)
		return struct0[schema.Connection_ping_Results](fut, release)
	})},
	"Connection.key": {right: itx.RightRead, pathed: true, call: withConnection(func(ctx context.Context, c schema.Connection) error {
		fut, release := c.Key(ctx, nil)
		return struct0[schema.Connection_key_Results](fut, release)
	})},

	"Handle.cancel": {right: itx.RightRead, pathed: true, call: withStream(func(ctx context.Context, s schema.Stream) error {
		fut, release := s.LiveState(ctx, func(p schema.Stream_liveState_Params) error {
			return p.SetSubscriber(schema.LiveSubscriber_ServerToClient(quietLive{}))
		})
		defer release()
		c, rel := fut.Handle().Cancel(ctx, nil)
		return struct0[schema.Handle_cancel_Results](c, rel)
	})},

	"Capabilities.mount": {right: itx.RightSubscribe, call: func(ctx context.Context, p schema.Project, _ string) error {
		h, err := client.MountReceiver(ctx, p, "rcv-test", client.ServeReceiver(func(context.Context, itx.DeliveryBatch) (int64, error) { return 0, nil }))
		if err == nil {
			h.Release()
		}
		return err
	}},
	"Capabilities.unmount": {right: itx.RightSubscribe, call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Capabilities(ctx, nil)
		defer release()
		return client.Unmount(ctx, fut.Capabilities(), "no-such-mount")
	}},
	"Capabilities.list": {right: itx.RightRead, call: func(ctx context.Context, p schema.Project, _ string) error {
		fut, release := p.Capabilities(ctx, nil)
		defer release()
		_, err := client.ListMounts(ctx, fut.Capabilities())
		return err
	}},

	"Readers.register": {right: itx.RightRead, pathed: true, call: withReaders(func(ctx context.Context, r schema.Readers) error {
		return client.RegisterReader(ctx, r, "reader", 0)
	})},
	"Readers.list": {right: itx.RightRead, pathed: true, call: withReaders(func(ctx context.Context, r schema.Readers) error {
		_, err := client.ListReaders(ctx, r)
		return err
	})},
	"Readers.remove": {right: itx.RightRead, pathed: true, call: withReaders(func(ctx context.Context, r schema.Readers) error {
		return client.RemoveReader(ctx, r, "no-such-reader")
	})},

	"ProcessorHosts.mount": {right: itx.RightSubscribe, andRead: true, call: withProcessors(func(ctx context.Context, h schema.ProcessorHosts) error {
		fut, release := h.Mount(ctx, nil)
		return struct0[schema.ProcessorHosts_mount_Results](fut, release)
	})},
	"ProcessorHosts.list": {right: itx.RightRead, call: withProcessors(func(ctx context.Context, h schema.ProcessorHosts) error {
		_, err := client.ListProcessorHosts(ctx, h)
		return err
	})},
	"Processor.snapshot": {right: itx.RightRead, pathed: true, call: withProcessor(func(ctx context.Context, pr schema.Processor) error {
		_, err := client.Snapshot(ctx, pr)
		return err
	})},
	"Processor.getRuntimeState": {right: itx.RightRead, pathed: true, call: withProcessor(func(ctx context.Context, pr schema.Processor) error {
		_, err := client.RuntimeState(ctx, pr)
		return err
	})},
	"Processor.liveState": {right: itx.RightRead, pathed: true, call: withProcessor(func(ctx context.Context, pr schema.Processor) error {
		fut, release := pr.LiveState(ctx, nil)
		return struct0[schema.Processor_liveState_Results](fut, release)
	})},
	"ProcessorPorts.claim":    {viaWake: true},
	"ProcessorPorts.commit":   {viaWake: true},
	"ProcessorPorts.kvGet":    {viaWake: true},
	"ProcessorPorts.kvPut":    {viaWake: true},
	"ProcessorPorts.appendTo": {viaWake: true},
	"ProcessorPorts.schedule": {viaWake: true},
	"ProcessorPorts.setAlarm": {viaWake: true},
	"ProcessorPorts.check":    {viaWake: true},
	"ProcessorPorts.kvDelete": {viaWake: true},

	"Admin.createProject": {right: itx.RightAdmin, deploymentOnly: true, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		_, _, _, err := client.CreateProject(ctx, a, "scope-test-"+randomName())
		return err
	})},
	"Admin.listProjects": {right: itx.RightAdmin, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		_, err := client.ListProjects(ctx, a)
		return err
	})},
	"Admin.renameProject": {right: itx.RightAdmin, deploymentOnly: true, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		return client.RenameProject(ctx, a, "default", "default")
	})},
	"Admin.deleteProject": {right: itx.RightAdmin, deploymentOnly: true, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		return client.DeleteProject(ctx, a, "no-such-project", false)
	})},
	// A relative path: refused invalidArgument once the right is granted, so nothing is written.
	"Admin.backup": {right: itx.RightAdmin, deploymentOnly: true, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		_, err := client.Backup(ctx, a, "not-absolute")
		return err
	})},
	"Admin.download": {right: itx.RightAdmin, andRead: true, deploymentOnly: true, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		dir := filepath.Join(os.TempDir(), "itx-scope-download-"+randomName())
		defer os.RemoveAll(dir)
		_, err := client.DownloadBackup(ctx, a, dir)
		return err
	})},
	"Admin.createToken": {right: itx.RightAdmin, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		_, _, err := client.CreateToken(ctx, a, "", client.TokenOptions{Label: "sub-token",
			Scope: itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightAdmin}}})
		return err
	})},
	"Admin.listTokens": {right: itx.RightAdmin, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		_, err := client.ListTokens(ctx, a, "")
		return err
	})},
	"Admin.revokeToken": {right: itx.RightAdmin, call: withAdmin(func(ctx context.Context, a schema.Admin) error {
		return client.RevokeToken(ctx, a, "", "no-such-token")
	})},
}

var nameSeq int

func randomName() string {
	nameSeq++
	return string(rune('a'+nameSeq%26)) + itoa(nameSeq)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// deployment logs into the deployment root over a new connection.
func (ts *testServer) deployment(t testing.TB) schema.Project {
	t.Helper()
	p := dial(t, ts.addr).Login(context.Background(), ts.creds.DeploymentToken)
	t.Cleanup(p.Release)
	return p
}

// token creates a token of the default project through the deployment root.
func (ts *testServer) token(t testing.TB, scope itx.Scope) (string, itx.TokenInfo) {
	t.Helper()
	a := client.Admin(ctxT(t), ts.deployment(t))
	t.Cleanup(a.Release)
	tok, info, err := client.CreateToken(ctxT(t), a, "default", client.TokenOptions{Label: "test" + scope.Prefix, Scope: scope})
	require.NoError(t, err)
	return tok, info
}

// login logs in with token over a new connection.
func (ts *testServer) login(t testing.TB, token string) schema.Project {
	t.Helper()
	p := dial(t, ts.addr).Login(context.Background(), token)
	t.Cleanup(p.Release)
	return p
}

// A scoped token cannot read, append or subscribe outside its prefix or its rights, for every
// method the server serves (a schema method missing from methodCases fails the test), over RPC.
func TestAccess_ScopeEveryMethod(t *testing.T) {
	ts := startServer(t, server.Config{})
	ctx := ctxT(t)
	full := ts.project(t)
	for _, path := range []string{"/in/s", "/out/s"} {
		s := stream(t, full, path)
		mustAppend(t, s, ev("note", `{"n": 1}`))
		subs := client.Subscriptions(ctx, s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "sub",
			Receiver: client.Receiver{Kind: client.ReceiverItxCall, Capability: "rcv"}})
		subs.Release()
		require.NoError(t, err)
	}

	methods := served(t)
	for _, m := range methods {
		require.Contains(t, methodCases, m, "schema method %s has no case in methodCases: decide its right", m)
	}
	require.Len(t, methodCases, len(methods), "methodCases names a method the schema does not declare")

	// One whole-project token per right, one token with every right under /in, the deployment root.
	byRight := map[itx.Right]schema.Project{}
	for _, r := range itx.Rights {
		tok, _ := ts.token(t, itx.Scope{Rights: []itx.Right{r}})
		byRight[r] = ts.login(t, tok)
	}
	inTok, _ := ts.token(t, itx.Scope{Prefix: "/in"})
	in := ts.login(t, inTok)
	deployment := ts.deployment(t)

	// Gateway.version needs no login at all.
	g := dial(t, ts.addr).Gateway()
	vfut, vrel := g.Version(ctx, nil)
	require.NoError(t, struct0[schema.Gateway_version_Results](vfut, vrel))

	for _, m := range methods {
		c := methodCases[m]
		t.Run(m, func(t *testing.T) {
			ctx := ctxT(t)
			if c.viaWake {
				t.Skip("served only inside a processor host's wake")
			}
			if c.unserved {
				for _, p := range []schema.Project{full, in} {
					err := c.call(ctx, p, "/in/s")
					require.Error(t, err)
					require.Contains(t, []itx.Code{itx.EUnavailable, itx.EFailedPrecondition}, itx.ErrorCode(err), "%v", err)
				}
				return
			}
			notDenied := func(p schema.Project, path, who string) {
				err := c.call(ctx, p, path)
				require.NotEqual(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s on %s by %s: %v", m, path, who, err)
			}
			denied := func(p schema.Project, path, who string) {
				err := c.call(ctx, p, path)
				require.Equal(t, itx.EPermissionDenied, itx.ErrorCode(err), "%s on %s by %s must be refused: %v", m, path, who, err)
			}
			for _, r := range itx.Rights {
				switch {
				case c.right != "" && r != c.right:
					denied(byRight[r], "/in/s", "a token with only "+string(r))
				case c.deploymentOnly:
					denied(byRight[r], "/in/s", "a project's admin")
					notDenied(deployment, "/in/s", "the deployment root")
				case c.andRead:
					denied(byRight[r], "/in/s", "a token with only "+string(r))
				default:
					notDenied(byRight[r], "/in/s", "a token with only "+string(r))
				}
			}
			switch {
			case c.deploymentOnly:
				denied(in, "/in/s", "a project token")
			case c.wholeProject:
				denied(in, "/in/s", "a token limited to /in")
				notDenied(full, "/in/s", "the whole project")
			default:
				notDenied(in, "/in/s", "a token limited to /in")
			}
			if c.pathed {
				denied(in, "/out/s", "a token limited to /in")
				notDenied(full, "/out/s", "the whole project")
			}
		})
	}

	t.Run("list never names a stream outside the prefix", func(t *testing.T) {
		for _, prefix := range []string{"", "/", "/out", "/in"} {
			fut, release := in.Streams(ctx, nil)
			list, err := client.ListStreamsIn(ctx, fut.Streams(), prefix)
			release()
			require.NoError(t, err)
			for _, s := range list {
				require.True(t, itx.PathUnder(s.Path, "/in"), "%s listed under prefix %q", s.Path, prefix)
			}
			usage, err := client.DiskUsage(ctx, in, prefix)
			require.NoError(t, err)
			for _, u := range usage {
				require.True(t, itx.PathUnder(u.Path, "/in"), "diskUsage: %s listed under prefix %q", u.Path, prefix)
			}
			if prefix == "" {
				require.NotEmpty(t, usage, "diskUsage lists the scope's streams")
			}
		}
		all, err := client.ListStreams(ctx, full, "")
		require.NoError(t, err)
		require.Greater(t, len(all), 1)
	})
	t.Run("a copy into a stream outside the prefix is refused", func(t *testing.T) {
		s := stream(t, in, "/in/s")
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "copy",
			Receiver: client.Receiver{Kind: client.ReceiverCopyToStream, Path: "/out/s"}})
		requireCode(t, err, itx.EPermissionDenied)
	})
	t.Run("a dead-letter stream outside the prefix is refused", func(t *testing.T) {
		s := stream(t, in, "/in/s")
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{Name: "dead", OnFailingEvent: "skip",
			DeadLetterPath: "/out/dead", Receiver: client.Receiver{Kind: client.ReceiverWebhookPost, URL: "http://127.0.0.1:1/hook"}})
		requireCode(t, err, itx.EPermissionDenied)
		raw := itx.EventInput{Type: itx.TypeSubscriptionConfigured, Payload: []byte(`{"name": "dead", "receiver": {"action": "webhook-post",
			"url": "http://127.0.0.1:1/hook", "delivery": {"start": "now", "onFailingEvent": "skip", "deadLetterPath": "/out/dead"}}}`)}
		_, err = client.Append(ctx, s, []itx.EventInput{raw}, itx.AppendOptions{})
		requireCode(t, err, itx.EPermissionDenied)
	})
	t.Run("raw control events need what the verbs need", func(t *testing.T) {
		removed := itx.EventInput{Type: itx.TypeSubscriptionRemoved, Payload: []byte(`{"name": "sub"}`)}
		_, err := client.Append(ctx, stream(t, byRight[itx.RightAppend], "/in/s"), []itx.EventInput{ev("note", `{}`), removed}, itx.AppendOptions{})
		requireCode(t, err, itx.EPermissionDenied)
		copyOut := itx.EventInput{Type: itx.TypeSubscriptionConfigured,
			Payload: []byte(`{"name": "leak", "receiver": {"action": "copy-to-stream", "receivingStreamPath": "/out/s"}}`)}
		_, err = client.Append(ctx, stream(t, in, "/in/s"), []itx.EventInput{copyOut}, itx.AppendOptions{})
		requireCode(t, err, itx.EPermissionDenied)
		subs, err := client.ListSubscriptions(ctx, client.Subscriptions(ctx, stream(t, full, "/in/s")))
		require.NoError(t, err)
		for _, sub := range subs {
			require.NotEqual(t, "leak", sub.Name, "a refused append writes nothing")
		}
	})
	t.Run("a token cannot create a wider one", func(t *testing.T) {
		tok, _ := ts.token(t, itx.Scope{Prefix: "/in", Rights: []itx.Right{itx.RightAdmin, itx.RightRead}})
		a := client.Admin(ctx, ts.login(t, tok))
		defer a.Release()
		for _, sc := range []itx.Scope{{}, {Prefix: "/out", Rights: []itx.Right{itx.RightRead}}, {Prefix: "/in", Rights: []itx.Right{itx.RightAppend}}} {
			_, _, err := client.CreateToken(ctx, a, "", client.TokenOptions{Label: "wider", Scope: sc})
			requireCode(t, err, itx.EPermissionDenied)
		}
		_, narrow, err := client.CreateToken(ctx, a, "", client.TokenOptions{Label: "narrower", Scope: itx.Scope{Prefix: "/in/s", Rights: []itx.Right{itx.RightRead}}})
		require.NoError(t, err)
		// Nor revoke a wider one (the whole-project token), only its own kind.
		requireCode(t, client.RevokeToken(ctx, a, "", "tok_default"), itx.EPermissionDenied)
		require.NoError(t, client.RevokeToken(ctx, a, "", narrow.ID))
		_, err = client.DescribeProject(ctx, full)
		require.NoError(t, err)
	})
}
