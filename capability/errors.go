// Package capability exposes server/ as the Cap'n Proto capability graph of schema/itx.capnp.
// Its types are thin: decode the call, ask the server, encode the answer. Errors become capnp
// exceptions in exactly one place, fail.
package capability

import (
	"context"
	"errors"
	"strings"

	"capnproto.org/go/capnp/v3/exc"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/server"
)

// fail turns a domain error into the exception a client sees: the reason "itx.<code>: <message>"
// (see schema/itx.capnp, "Errors"), type overloaded for rateLimited and failed otherwise. A
// storage failure without a code (a directory write) gets the storage's code (server.StorageCode)
// like a refused append: resourceExhausted for a full disk, unavailable for a failing one.
func fail(err error) error {
	if err == nil {
		return nil
	}
	e := itx.AsError(err)
	if c := server.StorageCode(err); e.Code == itx.EInternal && c != itx.EInternal && c != "" {
		e = &itx.Error{Code: c, Message: e.Message}
	}
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

// notYet answers a method the schema declares but this server does not serve yet: exception type
// unimplemented, and like every other exception a reason carrying an itx code, so a client that
// matches on "itx.<code>: " never meets a reason without one.
func notYet(method string) error {
	return &exc.Exception{Type: exc.Unimplemented, Cause: itx.Errorf(itx.EUnavailable, "%s is not implemented by this server", method)}
}

// coded makes sure the error a handler returns carries an itx code: an exception made by fail,
// badArgs or notYet passes unchanged (its type kept), a domain error returned without fail goes
// through it, a cancelled context becomes cancelled and anything else (an encoding failure)
// internal. guarded applies it to every method, so no exception leaves itxd without
// "itx.<code>: " in its reason.
func coded(err error) error {
	if err == nil {
		return nil
	}
	x, isExc := err.(*exc.Exception)
	if isExc && strings.Contains(x.Error(), "itx."+string(itx.ErrorCode(err))+": ") {
		return err
	}
	if errors.Is(err, context.Canceled) && itx.ErrorCode(err) == itx.EInternal {
		return fail(itx.Errorf(itx.ECancelled, "the call was cancelled"))
	}
	if isExc {
		return &exc.Exception{Type: x.Type, Cause: itx.Errorf(itx.EInternal, "%v", x.Cause)}
	}
	return fail(err)
}
