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

// put stores client, taking ownership of the reference.
func (c *capCache) put(key string, client capnp.Client) {
	if el, ok := c.entries[key]; ok {
		el.Value.(*capEntry).client.Release()
		el.Value.(*capEntry).client = client
		c.lru.MoveToFront(el)
		return
	}
	c.entries[key] = c.lru.PushFront(&capEntry{key: key, client: client})
	for c.lru.Len() > c.max {
		oldest := c.lru.Back()
		e := oldest.Value.(*capEntry)
		c.lru.Remove(oldest)
		delete(c.entries, e.key)
		e.client.Release()
	}
}

// len reports how many clients the cache holds.
func (c *capCache) len() int { return c.lru.Len() }

// releaseAll releases every client, for a session's end or a reconnect.
func (c *capCache) releaseAll() {
	for el := c.lru.Front(); el != nil; el = el.Next() {
		el.Value.(*capEntry).client.Release()
	}
	c.lru.Init()
	c.entries = make(map[string]*list.Element)
}
