package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A method that takes one name (Streams.get, Subscriptions.get, resumeSubscription, remove,
// cancelScheduled, Readers.remove, ...) refuses a second argument, as getEvents refuses a third
// and list() refuses one: resumeSubscription("m", 1) or get("/a", {includeEphemeral: true})
// must not run as if the extra value were not there.
func TestEval_OneNameMethodsRefuseMoreArguments(t *testing.T) {
	ts := startServer(t)
	s := newSession(t, ts)
	s.mustEval(t, `var st = project.streams.get("/more"); st.append({type: "a"})`)
	s.mustEval(t, `st.subscriptions.configure("mirror", {type: "copy-to-stream", path: "/more-copy"})`)
	for _, src := range []string{
		`project.streams.get("/more", "/other").describe()`,
		`project.streams.get("/more", {includeEphemeral: true}).describe()`,
		`st.subscriptions.get("mirror", "other").describe()`,
		`st.resumeSubscription("mirror", 1)`,
		`st.subscriptions.remove("mirror", "other")`,
		`st.cancelScheduled("k", 1)`,
		`st.readers.remove("r", 1)`,
		`project.capabilities.unmount("c", 1)`,
	} {
		f := s.failure(t, src)
		require.Equal(t, "invalidArgument", f.Code, src)
		require.Contains(t, f.Message, "too many arguments", src)
	}
	// The subscription is still there: remove("mirror", "other") did not remove it.
	require.Equal(t, "mirror", obj(t, s.mustEval(t, `st.subscriptions.get("mirror").describe()`))["config"].(map[string]any)["name"])
	// An absent trailing value is no argument, as for methods that take none.
	require.Equal(t, "/more", obj(t, s.mustEval(t, `project.streams.get("/more", undefined).describe()`))["path"])
}
