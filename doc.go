// Package itx is the domain vocabulary every part of the itx server shares: events and their
// offsets, stream paths, appends, queries and pages, subscription names, configs and
// descriptions, delivery batches, receiver kinds, limits and typed error codes.
//
// It imports nothing of this module. storage/ persists it, server/ runs it, capability/ exposes
// it as a Cap'n Proto capability graph, wire/ is its only codec to and from the schema, client/
// speaks it to a server and processors/ builds the stream-processor SDK on it.
package itx
