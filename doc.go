// Package itx is the domain vocabulary every part of the itx server shares: events and their
// offsets, stream paths, subscription names, receiver kinds, limits and typed error codes.
//
// It imports nothing of this module. storage/ persists it, server/ runs it, capability/ exposes
// it as a Cap'n Proto capability graph and processors/ builds the stream-processor SDK on it.
package itx
