package server

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	jsonata "github.com/blues/jsonata-go"
	"github.com/blues/jsonata-go/jlib"
	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// A user's JSONata runs inside the server. Unbounded, a recursive expression overflows the Go
// stack, a fatal error that ends the process; these must come back as errors instead.
func TestJSONata_RunawayExpressionsStopAtTheirLimits(t *testing.T) {
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{"total":3,"items":[1,2,3]}`)}
	for _, tc := range []struct {
		name, src, limit string
	}{
		{"self recursion", `($f := function($x){ $f($x) + 1 }; $f(1))`, "depth"},
		{"recursion through a parameter", `($g := function($h){ $h($h) }; $g($g))`, "depth"},
		{"recursion through a higher-order built-in", `($f := function($g){ $map([$g], $g) }; $f($f))`, "depth"},
		{"a long loop", `$sum($map([1..100000], function($i){ (($i * 2 + 1) * 3 - 1) / 2 }))`, "step"},
		{"a doubling string", `($d := function($s, $n){ $n = 0 ? $s : $d($s & $s, $n - 1) }; $d("x", 40))`, "string size"},
		{"a doubling join", `($d := function($s, $n){ $n = 0 ? $s : $d($join([$s, $s]), $n - 1) }; $d("x", 40))`, "string size"},
		{"a doubling array", `($d := function($a, $n){ $n = 0 ? $a : $d($append($a, $a), $n - 1) }; $count($d([1], 40)))`, "array size"},
		{"a huge pad", `$pad("x", 100000000)`, "string size"},
		{"a multiplying replace", `$replace($pad("", 1000, "x"), /x/, $pad("", 100000, "y"))`, "string size"},
		{"a multiplying plain replace", `$replace($pad("", 1000, "x"), "x", $pad("", 100000, "y"))`, "string size"},
		{"a huge range", `$count([1..200000])`, "range"}, // upstream's own error, at our bound
		{"many large ranges", `$map([1..50000], function($v){[1..50000]})`, "total items"},
		{"many large strings", `$map([1..100], function($v){$pad("", 1000000, "x")})`, "total string bytes"},
		{"a shared structure encoded", `($d := function($a, $n){ $n = 0 ? $a : $d({"l": $a, "r": $a}, $n - 1) }; $string($d([1], 60)))`, "result size"},
		{"a shared structure walked", `($d := function($a, $n){ $n = 0 ? $a : $d({"l": $a, "r": $a}, $n - 1) }; $count($d([1], 60).**))`, "result size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expr, err := CompileJSONata(tc.src)
			require.NoError(t, err)
			_, err = evalJSONata("", expr, ev)
			var lim *jsonata.LimitError
			var size *jlib.SizeError
			switch {
			case errors.As(err, &lim):
				if (tc.limit == "step" || tc.limit == "depth") && lim.Limit == "time" {
					tc.limit = "time" // a slow machine (or -race under load) may reach the time limit first
				}
				require.Equal(t, tc.limit, lim.Limit)
			case errors.As(err, &size):
				require.Equal(t, tc.limit, size.What)
			case tc.limit == "range":
				require.ErrorContains(t, err, "range operator has too many items")
			default:
				t.Fatalf("want a limit error, got %v", err)
			}

			_, err = EvalCondition(expr, ev)
			require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "a condition that runs away is the user's error: %v", err)
			_, err = applyTransform("", expr, ev)
			require.Error(t, err)
		})
	}
}

// A transform whose result shares itself is refused before it is encoded.
func TestJSONata_SharedTransformResultIsRefused(t *testing.T) {
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{}`)}
	expr, err := CompileJSONata(`($d := function($a, $n){ $n = 0 ? $a : $d({"l": $a, "r": $a}, $n - 1) }; {"payload": $d({"x": 1}, 60)})`)
	require.NoError(t, err)
	_, err = applyTransform("", expr, ev)
	var size *jlib.SizeError
	require.True(t, errors.As(err, &size), "%v", err)
	require.Equal(t, "result size", size.What)
}

func TestJSONata_OrdinaryExpressionsAreUnaffected(t *testing.T) {
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{"total":3,"items":[1,2,3]}`)}
	expr, err := CompileJSONata(`($sq := function($x){ $x * $x }; $sum($map(payload.items, $sq)) = 14 and offset = 7)`)
	require.NoError(t, err)
	ok, err := EvalCondition(expr, ev)
	require.NoError(t, err)
	require.True(t, ok)

	// Recursion that ends is still allowed, well within the depth limit.
	expr, err = CompileJSONata(`($tri := function($n){ $n = 0 ? 0 : $n + $tri($n - 1) }; {"payload": {"t": $tri(payload.total * 100)}})`)
	require.NoError(t, err)
	out, err := applyTransform("", expr, ev)
	require.NoError(t, err)
	require.JSONEq(t, `{"t": 45150}`, string(out.Payload))
}

func TestJSONata_OversizedExpressionIsRefused(t *testing.T) {
	_, err := CompileJSONata(`"` + strings.Repeat("x", itx.MaxJSONataLength) + `"`)
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err))
	_, err = CompileJSONata(`"` + strings.Repeat("x", itx.MaxJSONataLength-2) + `"`)
	require.NoError(t, err)
}

// Inputs on which the library itself misbehaved, found by fuzzing evalJSONata: each must be
// answered, not hang or panic.
func TestJSONata_LibraryDefectsFoundByFuzzing(t *testing.T) {
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{}`)}

	// The lexer panicked (slice bounds out of range): compiling is a refusal, not a crash.
	_, err := CompileJSONata("!\u03e500000000000")
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)

	// A lone "!" in a lambda's signature made the lexer stop advancing: compiling never ended.
	_, err = CompileJSONata("function()<000!0000")
	require.Equal(t, itx.EInvalid, itx.ErrorCode(err), "%v", err)
	neq, err := CompileJSONata(`payload.total != 2 and payload.total!=4`)
	require.NoError(t, err, "!= still lexes")
	ok, err := EvalCondition(neq, &itx.Event{Payload: []byte(`{"total":3}`)})
	require.NoError(t, err)
	require.True(t, ok)

	// $fromMillis with a long picture divided by zero: recovered, it is the expression's error.
	expr, err := CompileJSONata(`$fromMillis(0, "[Y` + strings.Repeat("0", 130) + `]")`)
	require.NoError(t, err)
	_, err = evalJSONata("", expr, ev)
	require.ErrorContains(t, err, "integer divide by zero")

	// $fromMillis with a huge width modifier padded a string of that many bytes: memory ran out.
	expr, err = CompileJSONata(`$fromMillis(0, "[C,2000009990]")`)
	require.NoError(t, err)
	_, err = evalJSONata("", expr, ev)
	require.ErrorContains(t, err, "width cannot be more than 1000")

	// $formatNumber with an exponent looped forever on zero and on negative numbers. A negative
	// number now formats as its absolute value with a minus sign.
	format := func(src string) string {
		expr, err := CompileJSONata(src)
		require.NoError(t, err)
		got, err := evalJSONata("", expr, ev)
		require.NoError(t, err, src)
		return got.(string)
	}
	require.Equal(t, "0.0e00", format(`$formatNumber(0, "#e00")`))
	require.Equal(t, "-"+format(`$formatNumber(5, "#e00")`), format(`$formatNumber(-5, "#e00")`))
	require.Equal(t, "-"+format(`$formatNumber(1234.5, "00.0e0")`), format(`$formatNumber(-1234.5, "00.0e0")`))
	require.Equal(t, "12.3e2", format(`$formatNumber(1234.5, "00.0e0")`))
}

// BenchmarkJSONata compares a typical transform evaluated with the limits (as the server does)
// and with plain Eval (no depth, step or time budget): the cost of the budget.
func BenchmarkJSONata(b *testing.B) {
	ev := &itx.Event{Offset: 7, Type: "order", Payload: []byte(`{"total":3,"items":[1,2,3],"customer":{"id":"c1","tier":"gold"}}`)}
	expr, err := CompileJSONata(`{"type": "copied/" & type, "payload": {"total": payload.total * 2, "n": $count(payload.items), "gold": payload.customer.tier = "gold"}}`)
	require.NoError(b, err)
	b.Run("limited", func(b *testing.B) {
		for b.Loop() {
			if _, err := evalJSONata("", expr, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unbudgeted", func(b *testing.B) {
		for b.Loop() {
			if _, err := expr.Eval(EventDocument(ev)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The budget is a setting (itxd's --jsonata-max-items, --jsonata-max-bytes, --jsonata-max-steps,
// --jsonata-timeout, --jsonata-concurrency): a smaller one stops an expression the default lets
// through.
func TestSetJSONataBudget(t *testing.T) {
	t.Cleanup(func() { SetJSONataBudget(JSONataBudget{}) })
	ev := &itx.Event{Offset: 1, Type: "t", Payload: []byte(`{}`)}
	for _, tc := range []struct {
		budget     JSONataBudget
		src, limit string
	}{
		{JSONataBudget{MaxItems: 1000}, `$count($map([1..100], function($v){[1..20]}))`, "total items"},
		{JSONataBudget{MaxBytes: 1000}, `$map([1..10], function($v){$pad("", 200, "x")})`, "total string bytes"},
		{JSONataBudget{MaxSteps: 1000}, `$count($map([1..2000], function($v){$v + 1}))`, "step"},
		{JSONataBudget{Timeout: time.Nanosecond}, `$count($map([1..2000], function($v){$v + 1}))`, "time"},
	} {
		expr, err := CompileJSONata(tc.src)
		require.NoError(t, err)
		SetJSONataBudget(JSONataBudget{})
		_, err = evalJSONata("", expr, ev)
		require.NoError(t, err, "within the default budget")
		tc.budget.Concurrency = 1
		SetJSONataBudget(tc.budget)
		_, err = evalJSONata("", expr, ev)
		var lim *jsonata.LimitError
		require.ErrorAs(t, err, &lim, tc.src)
		require.Equal(t, tc.limit, lim.Limit)
		require.Contains(t, err.Error(), jsonataLimitFlags[tc.limit], "the refusal names the flag that sets it")
	}
	require.Equal(t, 1, jsonataSlots.size)
}

// Subscriptions evaluate their conditions and transforms on their own goroutines, all at once.
// The library's built-ins are shared values, and a call used to store its evaluation context on
// them: a context-defaulting call such as name.$uppercase() could read another evaluation's
// input (another subscription's event) between the store and the call.
func TestJSONata_ConcurrentEvaluationsKeepTheirOwnContext(t *testing.T) {
	expr, err := CompileJSONata(`payload.name.$uppercase() & "/" & $string(offset)`)
	require.NoError(t, err)
	const workers, rounds = 8, 2000
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			name := strings.Repeat(string(rune('a'+w)), w+1)
			want := strings.ToUpper(name) + "/" + strconv.Itoa(w)
			ev := &itx.Event{Offset: int64(w), Type: "t", Payload: []byte(`{"name":"` + name + `"}`)}
			for range rounds {
				got, err := evalJSONata("", expr, ev)
				if err != nil {
					errs <- err
					return
				}
				if got != want {
					errs <- fmt.Errorf("worker %d got %v, want %q", w, got, want)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
}
