package itxtest

import "github.com/itx-dev/itx"

// ControlAppendCases are stream/* events a processor might append, with itxd's verdict on each
// (a subscription "hook" exists): test/'s TestProcessors_ControlEventAppendsAsTheHarnessJudgesThem
// sends them to a real itxd and processors/testing's TestMemoryStream_RefusesControlEventsItxdRefuses
// to the harness's in-memory stream, so the two stay in step.
var ControlAppendCases = []struct {
	Name, Type, Payload string
	OK                  bool
}{
	{"woken is the server's", itx.TypeWoken, `{"incarnationId":"x","reason":"loaded"}`, false},
	{"halted is the server's", itx.TypeSubscriptionHalted, `{"name":"hook","error":"x","attempts":1}`, false},
	{"unknown control type", "stream/made-up", `{}`, false},
	{"configured without a receiver", itx.TypeSubscriptionConfigured, `{"name":"x"}`, false},
	{"configured with an unknown receiver", itx.TypeSubscriptionConfigured, `{"name":"x","receiver":{"action":"nope"}}`, false},
	{"cursor-set with an unknown field", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":0,"x":1}`, false},
	{"cursor-set without a name", itx.TypeSubscriptionCursorSet, `{"afterOffset":0}`, false},
	{"cursor-set below 0", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":-1}`, false},
	{"removed without the reason", itx.TypeSubscriptionRemoved, `{"name":"hook"}`, false},
	{"resumed without a name", itx.TypeSubscriptionResumed, `{}`, false},
	{"error-occurred without a message", itx.TypeErrorOccurred, `{"error":{}}`, false},
	{"configured", itx.TypeSubscriptionConfigured, `{"name":"x","receiver":{"action":"processor-wake"}}`, true},
	{"cursor-set", itx.TypeSubscriptionCursorSet, `{"name":"hook","afterOffset":0}`, true},
	{"removed", itx.TypeSubscriptionRemoved, `{"name":"hook","reason":"requested"}`, true},
	{"error-occurred", itx.TypeErrorOccurred, `{"message":"m"}`, true},
	{"an ordinary event", "order/placed", `{}`, true},
}
