package server

import (
	"container/list"
	"sync"
	"sync/atomic"

	jsonata "github.com/blues/jsonata-go"
	"github.com/itx-dev/itx"
)

// A compiled JSONata expression takes about 10-30 times its text in memory (a 16 KiB condition,
// 150-450 KiB), and subscriptions held theirs for as long as their stream was loaded, barriers
// for as long as they waited: 256 subscriptions with 16 KiB conditions and transforms held about
// 230 MB per loaded stream, 8 connections of waitForEvent calls with a 16 KiB `where` 400 MB.
// What the server holds compiled is now bounded over the process: every holder keeps its
// expression's text and a jsonataRef, compiled on use and kept, least recently used first out,
// while all of them together are estimated within JSONataBudget.MaxCompiledBytes; an expression
// dropped is compiled again on its next use (a 16 KiB one in about 3 ms, a typical one in
// microseconds).

// DefaultJSONataCompiledBytes is JSONataBudget.MaxCompiledBytes's default (itxd
// --jsonata-max-compiled-bytes).
const DefaultJSONataCompiledBytes = 64 << 20

// jsonataCompiledCost estimates what an expression of n bytes of text takes compiled (measured:
// 10-30 times its text, most for long runs of small operators).
func jsonataCompiledCost(n int) int64 { return 512 + 32*int64(n) }

// jsonataRef is a user's JSONata expression (a subscription's condition or transform, a
// barrier's `where`), compiled on use.
type jsonataRef struct {
	src     string
	project string // whose expression: its evaluations wait in that project's turn (jsonataTurns)
	cost    int64
	expr    atomic.Pointer[jsonata.Expr] // nil: not compiled, or dropped
	elem    *list.Element                // in compiledJSONata.lru; guarded by compiledJSONata.mu
}

// jsonataCache is the set of compiled expressions the process keeps, most recently used first.
type jsonataCache struct {
	mu     sync.Mutex
	lru    list.List // of *jsonataRef
	bytes  int64     // their estimated cost
	budget int64
}

var compiledJSONata = jsonataCache{budget: DefaultJSONataCompiledBytes}

// newJSONataRef compiles src (refusing a bad one as CompileJSONata does) and keeps it compiled
// within the process's budget.
func newJSONataRef(src, project string) (*jsonataRef, error) {
	r := &jsonataRef{src: src, project: project, cost: jsonataCompiledCost(len(src))}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	return r, nil
}

// get is the compiled expression, compiled again if it was dropped.
func (r *jsonataRef) get() (*jsonata.Expr, error) {
	if e := r.expr.Load(); e != nil {
		c := &compiledJSONata
		c.mu.Lock()
		if r.elem != nil {
			c.lru.MoveToFront(r.elem)
		}
		c.mu.Unlock()
		return e, nil
	}
	e, err := CompileJSONata(r.src)
	if err != nil {
		return nil, err
	}
	r.expr.Store(e)
	r.keep()
	return e, nil
}

// keep counts r's compiled expression in the budget, dropping the least recently used ones
// (r itself last: an expression larger than the whole budget is used once and dropped).
func (r *jsonataRef) keep() {
	c := &compiledJSONata
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.elem == nil {
		r.elem = c.lru.PushFront(r)
		c.bytes += r.cost
	}
	for c.bytes > c.budget && c.lru.Len() > 0 {
		back := c.lru.Back()
		if back == r.elem && c.lru.Len() > 1 {
			c.lru.MoveToFront(back)
			continue
		}
		c.dropLocked(back.Value.(*jsonataRef))
	}
}

// release drops r's compiled expression now (its holder is gone).
func (r *jsonataRef) release() {
	if r == nil {
		return
	}
	c := &compiledJSONata
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.elem != nil {
		c.dropLocked(r)
	}
}

func (c *jsonataCache) dropLocked(r *jsonataRef) {
	c.lru.Remove(r.elem)
	r.elem = nil
	c.bytes -= r.cost
	r.expr.Store(nil)
}

// setBudget bounds the estimated bytes of the compiled expressions kept (SetJSONataBudget).
func (c *jsonataCache) setBudget(b int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.budget = b
	for c.bytes > c.budget && c.lru.Len() > 0 {
		c.dropLocked(c.lru.Back().Value.(*jsonataRef))
	}
}

// compiledJSONataBytes is the estimated size of the compiled expressions kept (tests, metrics).
func compiledJSONataBytes() int64 {
	c := &compiledJSONata
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// holds evaluates the expression as a condition over e (EvalCondition).
func (r *jsonataRef) holds(e *itx.Event) (bool, error) {
	expr, err := r.get()
	if err != nil {
		return false, err
	}
	return evalCondition(r.project, expr, e)
}

// apply evaluates the expression as a transform of e (applyTransform).
func (r *jsonataRef) apply(e *itx.Event) (itx.Event, error) {
	expr, err := r.get()
	if err != nil {
		return itx.Event{}, err
	}
	return applyTransform(r.project, expr, e)
}
