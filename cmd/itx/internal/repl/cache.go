package repl

import (
	"container/list"

	"capnproto.org/go/capnp/v3"
)

// capCache owns the pipelined clients that capability proxies stand for, keyed by their path
// from the project. JavaScript has no finalizers we can rely on, so proxies hold a path, not a
// client: the cache keeps the most recently used clients alive (a variable holding a stream
// reuses its pipelined client call after call) and releases the least recently used one when
// it is full, so a script that visits ten thousand streams does not pin ten thousand
// capabilities on the server. An evicted path is simply reached again on its next use.
type capCache struct {
	max     int
	lru     *list.List // of *capEntry, most recent first
	entries map[string]*list.Element
}

type capEntry struct {
	key    string
	client capnp.Client
	answer capnp.ReleaseFunc // the release of the navigation call's answer (see navigator)
}

// drop releases the entry's client, then its answer. The answer's release waits for the answer
// if it has not come yet, so it runs on its own goroutine: dropping never blocks the prompt.
func (e *capEntry) drop() {
	e.client.Release()
	if e.answer != nil {
		go e.answer()
	}
}

func newCapCache(max int) *capCache {
	return &capCache{max: max, lru: list.New(), entries: make(map[string]*list.Element)}
}

// get returns a new reference to the cached client, if any.
func (c *capCache) get(key string) (capnp.Client, bool) {
	el, ok := c.entries[key]
	if !ok {
		return capnp.Client{}, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*capEntry).client.AddRef(), true
}

// put stores client and the release of the answer it came from, taking ownership of both.
func (c *capCache) put(key string, client capnp.Client, answer capnp.ReleaseFunc) {
	if el, ok := c.entries[key]; ok {
		el.Value.(*capEntry).drop()
		el.Value.(*capEntry).client, el.Value.(*capEntry).answer = client, answer
		c.lru.MoveToFront(el)
		return
	}
	c.entries[key] = c.lru.PushFront(&capEntry{key: key, client: client, answer: answer})
	for c.lru.Len() > c.max {
		oldest := c.lru.Back()
		e := oldest.Value.(*capEntry)
		c.lru.Remove(oldest)
		delete(c.entries, e.key)
		e.drop()
	}
}

// len reports how many clients the cache holds.
func (c *capCache) len() int { return c.lru.Len() }

// releaseAll releases every client, for a session's end or a reconnect.
func (c *capCache) releaseAll() {
	for el := c.lru.Front(); el != nil; el = el.Next() {
		el.Value.(*capEntry).drop()
	}
	c.lru.Init()
	c.entries = make(map[string]*list.Element)
}
