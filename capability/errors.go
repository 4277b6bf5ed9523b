// Package capability exposes server/ as the Cap'n Proto capability graph of schema/itx.capnp.
// Its types are thin: decode the call, ask the server, encode the answer. Errors become capnp
// exceptions in exactly one place, fail.
package capability

import (
	"errors"

	"capnproto.org/go/capnp/v3/exc"
	"github.com/itx-dev/itx"
)

// fail turns a domain error into the exception a client sees: the reason "itx.<code>: <message>"
// (see schema/itx.capnp, "Errors"), type overloaded for rateLimited and failed otherwise.
func fail(err error) error {
	if err == nil {
		return nil
	}
	e := itx.AsError(err)
	typ := exc.Failed
	if e.Code == itx.ERateLimited {
		typ = exc.Overloaded
	}
	return &exc.Exception{Type: typ, Cause: errors.New(e.Error())}
}

// badArgs reports an undecodable argument (a malformed message) as invalidArgument.
func badArgs(what string, err error) error {
	return fail(itx.Errorf(itx.EInvalid, "%s: %v", what, err))
}

// notYet answers a method the schema declares but this server does not serve yet.
func notYet(method string) error {
	return &exc.Exception{Type: exc.Unimplemented, Cause: errors.New(method + " is not implemented by this server")}
}
