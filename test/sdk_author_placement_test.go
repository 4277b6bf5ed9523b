package test

import (
	"testing"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/server"
	"github.com/stretchr/testify/require"
)

// A processor-wake subscription configured without placement "remote" (the default is
// in-process) for a contract only a remote host of the project holds halts at its first wake, as
// the seed says of a name no registered processor answers to, and its lastError now says that a
// mounted host holds the contract and what to change (without naming the host: every reader of
// the stream reads lastError); a name nobody holds (a typo) keeps the bare error.
// Before, both read `no processor is registered under the name "summarizer"`, while
// processors.list() showed that very contract mounted.
func TestProcessors_InProcessMissPointsAtTheRemoteHost(t *testing.T) {
	ts := startServer(t, server.Config{Processors: referenceHost(t, "forwarder")})
	ctx := ctxT(t)
	p := ts.project(t)
	host, err := sdkAuthorHost("placement", httpQAVendor("http://127.0.0.1:1"))
	require.NoError(t, err)
	runRemoteHost(t, ts.addr, ts.creds.ProjectToken, "metrics-host", host)
	awaitContract(t, p, "summarizer")
	s := stream(t, p, "/placement")
	for _, name := range []string{"summarizer", "sumarizer"} {
		subs := client.Subscriptions(ctx, s)
		_, _, err := client.ConfigureSubscription(ctx, subs, client.SubscriptionConfig{
			Name: name, Receiver: client.Receiver{Kind: client.ReceiverProcessorWake}})
		subs.Release()
		require.NoError(t, err)
	}
	mustAppend(t, s, sdkSample(1))
	lastErrors := map[string]string{}
	waitUntil(t, "both subscriptions halted", func() bool {
		subs := client.Subscriptions(ctx, s)
		defer subs.Release()
		list, err := client.ListSubscriptions(ctx, subs)
		require.NoError(t, err)
		for _, l := range list {
			if l.Status == itx.StatusHalted {
				lastErrors[l.Name] = l.LastError
			}
		}
		return len(lastErrors) == 2
	})
	require.Contains(t, lastErrors["summarizer"], `no processor is registered under the name "summarizer" in this itxd; a remote host mounted for this subscription holds it: configure the subscription with placement "remote"`)
	require.Contains(t, lastErrors["sumarizer"], `no processor is registered under the name "sumarizer"`)
	require.NotContains(t, lastErrors["sumarizer"], "remote host")
	require.NotContains(t, lastErrors["summarizer"], "metrics-host")
}
