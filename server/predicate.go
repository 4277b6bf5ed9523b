package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	jsonata "github.com/blues/jsonata-go"
	"github.com/itx-dev/itx"
)

type compiledPredicate struct {
	types    map[string]bool
	contains any
	where    *jsonataRef
}

func compilePredicate(p itx.Predicate) (*compiledPredicate, error) {
	if err := itx.ValidateTypeFilter("types", p.Types); err != nil {
		return nil, err
	}
	c := &compiledPredicate{types: typeSet(p.Types)}
	if len(bytes.TrimSpace(p.PayloadContains)) > 0 {
		if len(p.PayloadContains) > itx.MaxJSONataLength {
			return nil, itx.Errorf(itx.ETooLarge, "payloadContains is %d bytes, at most %d", len(p.PayloadContains), itx.MaxJSONataLength)
		}
		// Events refuse invalid UTF-8, so such a value could never match: the barrier would
		// wait out its timeout instead of saying what is wrong.
		if !utf8.Valid(p.PayloadContains) {
			return nil, itx.Errorf(itx.EInvalid, "payloadContains is not valid UTF-8")
		}
		v, err := decodeJSON(p.PayloadContains)
		if err != nil {
			return nil, itx.Errorf(itx.EInvalid, "payloadContains is not valid JSON: %v", err)
		}
		c.contains = v
	}
	if p.Where != "" {
		expr, err := newJSONataRef(p.Where, "") // its project is set by the barrier that runs it
		if err != nil {
			return nil, err
		}
		c.where = expr
	}
	return c, nil
}

func (c *compiledPredicate) match(e *itx.Event) (bool, error) {
	if c.types != nil && !c.types[e.Type] {
		return false, nil
	}
	if c.contains != nil {
		payload, err := decodeJSON(e.Payload)
		if err != nil {
			return false, nil
		}
		budget := MaxContainsSteps
		ok := containsWithin(payload, c.contains, &budget)
		if budget < 0 {
			return false, itx.Errorf(itx.ELimitExceeded, "payloadContains took more than %d comparisons on offset %d; narrow the pattern (or use types or where)", MaxContainsSteps, e.Offset)
		}
		if !ok {
			return false, nil
		}
	}
	if c.where != nil {
		return c.where.holds(e)
	}
	return true, nil
}

// jsonataLimits bound one evaluation of a user's expression. Without them a recursive
// expression overflows the Go stack, which ends the process (third_party/jsonata-go/PATCHES.md).
// No condition or transform over one event comes near them.
var jsonataLimits = jsonata.Limits{
	MaxDepth:       2000,
	MaxSteps:       DefaultJSONataSteps,
	Timeout:        DefaultJSONataTimeout,
	MaxStringBytes: itx.MaxEventBytes,
	MaxItems:       itx.MaxJSONataItems,
	MaxBytes:       itx.MaxJSONataBytes,
}

// jsonataSlots admits at most one evaluation per core at once, so the memory all evaluations
// hold is bounded by cores x one evaluation's budget. Evaluations past that wait, in turns by
// project (each ends within its time limit); past maxJSONataWaiting waiters, or a project's
// maxJSONataWaitingPerProject, an evaluation is refused outright.
var (
	jsonataSlots   = newJSONataTurns(runtime.GOMAXPROCS(0))
	jsonataWaiting atomic.Int64
)

const maxJSONataWaiting = 1024

// JSONataBudget is what one evaluation of a user's expression may spend, and how many run at
// once. A zero field takes its default.
type JSONataBudget struct {
	MaxItems    int64         // array items and object entries built in total; itx.MaxJSONataItems
	MaxBytes    int64         // string bytes built in total; itx.MaxJSONataBytes
	MaxSteps    int64         // evaluated nodes; DefaultJSONataSteps
	Timeout     time.Duration // wall clock; DefaultJSONataTimeout
	Concurrency int           // evaluations at once; one per core
	// MaxCompiledBytes bounds the compiled expressions kept over the process (estimated: see
	// jsonata_cache.go); DefaultJSONataCompiledBytes.
	MaxCompiledBytes int64
}

// The defaults of JSONataBudget's time bounds.
const (
	DefaultJSONataSteps   = 200_000
	DefaultJSONataTimeout = time.Second
)

// SetJSONataBudget replaces the budget, process-wide. Call it before any evaluation (itxd calls
// it from its flags before opening the server). The depth bound is not a setting: it keeps a
// recursive expression from overflowing the Go stack.
func SetJSONataBudget(b JSONataBudget) {
	if b.MaxItems <= 0 {
		b.MaxItems = itx.MaxJSONataItems
	}
	if b.MaxBytes <= 0 {
		b.MaxBytes = itx.MaxJSONataBytes
	}
	if b.MaxSteps <= 0 {
		b.MaxSteps = DefaultJSONataSteps
	}
	if b.Timeout <= 0 {
		b.Timeout = DefaultJSONataTimeout
	}
	if b.Concurrency <= 0 {
		b.Concurrency = runtime.GOMAXPROCS(0)
	}
	jsonataLimits.MaxItems, jsonataLimits.MaxBytes = b.MaxItems, b.MaxBytes
	jsonataLimits.MaxSteps, jsonataLimits.Timeout = b.MaxSteps, b.Timeout
	jsonataSlots = newJSONataTurns(b.Concurrency)
	if b.MaxCompiledBytes <= 0 {
		b.MaxCompiledBytes = DefaultJSONataCompiledBytes
	}
	compiledJSONata.setBudget(b.MaxCompiledBytes)
}

// errJSONataBusy is what an evaluation gets when too many are waiting for a core.
// It is the server's overload, not a verdict on the event (an outage to a delivery).
var errJSONataBusy error = itx.Errorf(itx.EUnavailable, "too many JSONata evaluations are waiting for a core")

// What one built-in may build: a string as large as an event, an array of 100,000 items.
func init() { jsonata.SetSizeLimits(itx.MaxEventBytes, itx.MaxJSONataArrayItems) }

// evalJSONata is the one place the server evaluates a user's JSONata, always within limits. A
// panic inside the library is that expression's error, not the server's end. project is whose
// expression it is: it waits for a slot in that project's turn.
func evalJSONata(project string, expr *jsonata.Expr, e *itx.Event) (res any, err error) {
	slots := jsonataSlots // a slot goes back to the turns it came from
	if err := slots.acquire(project); err != nil {
		return nil, err
	}
	defer slots.release()
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("JSONata evaluation failed: %v", p)
		}
	}()
	res, err = expr.EvalWithLimits(EventDocument(e), jsonataLimits)
	var lim *jsonata.LimitError
	if errors.As(err, &lim) && jsonataLimitFlags[lim.Limit] != "" {
		err = fmt.Errorf("%w (%s)", err, jsonataLimitFlags[lim.Limit])
	}
	return res, err
}

// jsonataLimitFlags names the itxd flag that sets each of jsonata.LimitError's limits.
var jsonataLimitFlags = map[string]string{
	"step": "--jsonata-max-steps", "time": "--jsonata-timeout",
	"total items": "--jsonata-max-items", "total string bytes": "--jsonata-max-bytes",
}

// CompileJSONata compiles a JSONata expression, refusing a bad or oversized one with EInvalid.
// The library's parser panics on some malformed input; that too is a refusal.
func CompileJSONata(src string) (expr *jsonata.Expr, err error) {
	if len(src) > itx.MaxJSONataLength {
		return nil, itx.Errorf(itx.EInvalid, "JSONata expression is %d bytes; at most %d are allowed", len(src), itx.MaxJSONataLength)
	}
	defer func() {
		if p := recover(); p != nil {
			expr, err = nil, itx.Errorf(itx.EInvalid, "invalid JSONata expression %q: %v", src, p)
		}
	}()
	expr, err = jsonata.Compile(src)
	if err != nil {
		return nil, itx.Errorf(itx.EInvalid, "invalid JSONata expression %q: %v", src, err)
	}
	return expr, nil
}

// EventDocument is the JSON value JSONata conditions and transforms see for an event. Numbers
// are float64, as JSONata's arithmetic expects: one beyond float64's range (valid JSON, kept in
// the log as sent) is ±Inf, as JavaScript's JSON.parse reads it, and the rest of its payload
// reads as usual (json.Unmarshal refuses such a number, and the payload was then left out
// whole: conditions on its other members never held, and transforms shaped it as {}).
func EventDocument(e *itx.Event) map[string]any {
	doc := map[string]any{"offset": float64(e.Offset), "type": e.Type, "createdAt": float64(e.CreatedAt)}
	if p, err := jsonataValue(e.Payload); err == nil {
		doc["payload"] = p
	}
	if len(e.Metadata) > 0 {
		if m, err := jsonataValue(e.Metadata); err == nil {
			doc["metadata"] = m
		}
	}
	if e.IdempotencyKey != "" {
		doc["idempotencyKey"] = e.IdempotencyKey
	}
	return doc
}

// jsonataValue decodes stored JSON into the values JSONata works on, numbers as float64 (±Inf
// past its range).
func jsonataValue(raw []byte) (any, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	return floatNumbers(v), nil
}

// floatNumbers replaces, in place, each json.Number in v by its float64 value.
func floatNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, _ := strconv.ParseFloat(string(x), 64) // ±Inf with ErrRange past the range: kept
		return f
	case map[string]any:
		for k, w := range x {
			x[k] = floatNumbers(w)
		}
	case []any:
		for i, w := range x {
			x[i] = floatNumbers(w)
		}
	}
	return v
}

// EvalCondition evaluates a JSONata condition over an event: it holds only when the result is
// exactly true (an undefined result is false, not an error).
func EvalCondition(expr *jsonata.Expr, e *itx.Event) (bool, error) {
	return evalCondition("", expr, e)
}

// evalCondition is EvalCondition of project's expression (evalJSONata).
func evalCondition(project string, expr *jsonata.Expr, e *itx.Event) (bool, error) {
	res, err := evalJSONata(project, expr, e)
	if err == jsonata.ErrUndefined {
		return false, nil
	}
	if errors.Is(err, errJSONataBusy) {
		return false, err
	}
	if err != nil {
		return false, itx.Errorf(itx.EInvalid, "JSONata condition failed on offset %d: %v", e.Offset, err)
	}
	b, ok := res.(bool)
	return ok && b, nil
}

func decodeJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	// The decoder stops after the first value: a payloadContains of `{}}` or `{"a":1} x` would
	// otherwise be taken as its first value, and the rest dropped unheard.
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON value")
	}
	return v, nil
}

// containsJSON reports whether v contains pattern: objects by key subset (recursively), arrays
// when every pattern element is contained in some element, scalars by equality (numbers by
// value).
// MaxContainsSteps bounds one payloadContains match against one event: comparisons of a
// pattern's arrays against a payload's arrays multiply, so a pattern of kilobytes could otherwise
// hold a core for minutes.
const MaxContainsSteps = 100_000

// containsJSON reports whether v contains pattern (objects by subset, arrays by each pattern
// element matching some element), without a budget (tests).
func containsJSON(v, pattern any) bool {
	budget := math.MaxInt
	return containsWithin(v, pattern, &budget)
}

// containsWithin is containsJSON counting each comparison against *budget; once it goes below
// zero the answer is false and the caller reports the budget spent.
func containsWithin(v, pattern any, budget *int) bool {
	if *budget--; *budget < 0 {
		return false
	}
	switch p := pattern.(type) {
	case map[string]any:
		o, ok := v.(map[string]any)
		if !ok {
			return false
		}
		for k, pv := range p {
			ov, ok := o[k]
			if !ok || !containsWithin(ov, pv, budget) {
				return false
			}
		}
		return true
	case []any:
		a, ok := v.([]any)
		if !ok {
			return false
		}
		for _, pe := range p {
			found := false
			for _, ae := range a {
				if containsWithin(ae, pe, budget) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	case json.Number:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		return itx.SameNumber(string(n), string(p))
	default:
		return fmt.Sprint(v) == fmt.Sprint(pattern) && sameKind(v, pattern)
	}
}

func sameKind(a, b any) bool {
	switch a.(type) {
	case string:
		_, ok := b.(string)
		return ok
	case bool:
		_, ok := b.(bool)
		return ok
	case nil:
		return b == nil
	}
	return false
}

// typeSet is a type filter as a set: nil (every type) when types is empty or holds "*".
func typeSet(types []string) map[string]bool {
	var set map[string]bool
	for _, t := range types {
		if t == "*" {
			return nil
		}
		if set == nil {
			set = map[string]bool{}
		}
		set[t] = true
	}
	return set
}
