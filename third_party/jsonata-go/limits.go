// This file is an itx addition to blues/jsonata-go v1.5.4 (see PATCHES.md). It bounds one
// evaluation, so an expression written by a user can neither overflow the Go stack (a fatal,
// unrecoverable error that would end the whole process) nor run or grow without end.

package jsonata

import (
	"fmt"
	"reflect"
	"time"

	"github.com/blues/jsonata-go/jlib"
	"github.com/blues/jsonata-go/jparse"
	"github.com/blues/jsonata-go/jtypes"
)

// Limits bound one evaluation. A zero field is no limit.
type Limits struct {
	MaxDepth       int           // nested evaluation frames, recursion included
	MaxSteps       int64         // evaluated nodes, in total
	Timeout        time.Duration // wall clock, checked every 256 steps
	MaxStringBytes int           // the result of one string concatenation
	// MaxItems and MaxBytes bound everything the evaluation builds, in total across all its
	// intermediate values: array items and object entries, and string bytes. The counts are
	// taken on the result of every node that builds a value (see charge), so a value passed up
	// through several nodes counts more than once: the bound errs on the safe side.
	MaxItems int64
	MaxBytes int64
}

// LimitError reports the limit an evaluation ran into.
type LimitError struct {
	Limit string
	Max   int64
}

func (e *LimitError) Error() string {
	if e.Limit == "time" {
		return fmt.Sprintf("evaluation exceeded its time limit of %s", time.Duration(e.Max))
	}
	return fmt.Sprintf("evaluation exceeded its %s limit of %d", e.Limit, e.Max)
}

type budget struct {
	limits   Limits
	depth    int
	steps    int64
	items    int64
	bytes    int64
	deadline time.Time
}

// charge counts what a node built against the evaluation's totals.
func (b *budget) charge(v reflect.Value) error {
	if !v.IsValid() {
		return nil
	}
	r := jtypes.Resolve(v)
	switch r.Kind() {
	case reflect.String:
		b.bytes += int64(r.Len())
		if b.limits.MaxBytes > 0 && b.bytes > b.limits.MaxBytes {
			return &LimitError{Limit: "total string bytes", Max: b.limits.MaxBytes}
		}
	case reflect.Slice, reflect.Array, reflect.Map:
		b.items += int64(r.Len())
		if b.limits.MaxItems > 0 && b.items > b.limits.MaxItems {
			return &LimitError{Limit: "total items", Max: b.limits.MaxItems}
		}
	}
	return nil
}

// builds reports whether evaluating node may build a new value (and so is charged): literals,
// variable references, lambdas and nodes that return one of their operands' values are not.
// A name step builds only when it maps over an array.
func builds(node jparse.Node, input reflect.Value) bool {
	switch node.(type) {
	case *jparse.StringNode, *jparse.NumberNode, *jparse.BooleanNode, *jparse.NullNode,
		*jparse.RegexNode, *jparse.VariableNode, *jparse.LambdaNode, *jparse.TypedLambdaNode,
		*jparse.PartialNode, *jparse.ConditionalNode, *jparse.BlockNode, *jparse.AssignmentNode:
		return false
	case *jparse.NameNode:
		return jtypes.IsArray(input)
	}
	return true
}

func (b *budget) enter() error {
	b.depth++
	b.steps++
	if b.limits.MaxDepth > 0 && b.depth > b.limits.MaxDepth {
		b.depth--
		return &LimitError{Limit: "depth", Max: int64(b.limits.MaxDepth)}
	}
	if b.limits.MaxSteps > 0 && b.steps > b.limits.MaxSteps {
		b.depth--
		return &LimitError{Limit: "step", Max: b.limits.MaxSteps}
	}
	if b.limits.Timeout > 0 && b.steps&255 == 0 && time.Now().After(b.deadline) {
		b.depth--
		return &LimitError{Limit: "time", Max: int64(b.limits.Timeout)}
	}
	return nil
}

func (b *budget) leave() { b.depth-- }

// EvalWithLimits is Eval bounded by lim: an evaluation that exceeds a limit stops with a
// *LimitError.
func (e *Expr) EvalWithLimits(data interface{}, lim Limits) (interface{}, error) {
	input, ok := data.(reflect.Value)
	if !ok {
		input = reflect.ValueOf(data)
	}
	env := e.newEnv(input)
	env.budget = &budget{limits: lim}
	if lim.Timeout > 0 {
		env.budget.deadline = time.Now().Add(lim.Timeout)
	}
	result, err := eval(e.node, input, env)
	return e.result(result, err)
}

// SetSizeLimits bounds, process-wide, the strings and arrays that built-in functions, ranges and
// walks may build (see jlib.MaxStringBytes). Call it once, before any evaluation.
func SetSizeLimits(maxStringBytes, maxArrayItems int) {
	jlib.MaxStringBytes, jlib.MaxArrayItems = maxStringBytes, maxArrayItems
}
