// Package examples holds the reference processors of seed 002, one per modality: Guestbook, a
// pure projector; Forwarder, a durable forwarder (every event becomes an append with a stable
// key); Router, a durable fan-out to other streams (Args.AppendTo); and Agent, an obligation processor driving a fake LLM vendor (requested / started /
// settled, expiresAt, a hesitation window). Their tests are the seed's scenarios, written with
// processors/testing.
package examples
