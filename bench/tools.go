//go:build tools

// Package bench holds the side-by-side harness; this file pins the NATS server it builds and
// runs as its own process (`go build github.com/nats-io/nats-server/v2`).
package bench

import _ "github.com/nats-io/nats-server/v2"
