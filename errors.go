package itx

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Code is a typed error code. The values are the enumerant names of schema ErrorCode, so a code
// crosses the wire unchanged (see schema/itx.capnp, "Errors").
type Code string

// The fixed set of error codes. A client sees the code, never a Go string, so add one only when a
// caller must react to it differently from every existing code.
const (
	EInvalid             Code = "invalidArgument"     // bad input; nothing of the call was written
	ENotFound            Code = "notFound"            // no such subscription, reader, capability
	EIdempotencyConflict Code = "idempotencyConflict" // the key belongs to an event with another body
	EOffsetConflict      Code = "offsetConflict"      // a conditional append found another head
	ERateLimited         Code = "rateLimited"         // the stream's circuit breaker refused the call
	ETooLarge            Code = "tooLarge"            // an event or batch over its size limit
	EUnauthenticated     Code = "unauthenticated"     // unknown token
	EDeadlineExceeded    Code = "deadlineExceeded"    // a barrier timed out
	EUnavailable         Code = "unavailable"         // shutting down, or the stream cannot be opened
	ELimitExceeded       Code = "limitExceeded"       // a count cap was reached
	EInternal            Code = "internal"            // a bug or an I/O failure
	ECapabilityOffline   Code = "capabilityOffline"   // no Receiver mounted under the name
	EFailedPrecondition  Code = "failedPrecondition"  // the target is in the wrong state
	ECancelled           Code = "cancelled"           // the caller went away
	EResourceExhausted   Code = "resourceExhausted"   // the disk is full; nothing was written
	EPermissionDenied    Code = "permissionDenied"    // the token's scope or an attenuated capability does not allow it
)

// EDisconnected is the code the Go client gives a call whose RPC connection to itxd was lost
// before its answer came, and a Connection or LiveView that ended so (closed: connectionLost).
// The call may or may not have taken effect: dial again, read back what matters, and send again
// what must happen once with an idempotency key. itxd never sends it (it is not in Codes, the
// wire's codes); the client tells it from go-capnp's disconnected exception, which carries no
// code.
const EDisconnected Code = "disconnected"

// Codes lists every code that crosses the wire, for exhaustiveness checks against the schema.
var Codes = []Code{
	EInvalid, ENotFound, EIdempotencyConflict, EOffsetConflict, ERateLimited, ETooLarge,
	EUnauthenticated, EDeadlineExceeded, EUnavailable, ELimitExceeded, EInternal,
	ECapabilityOffline, EFailedPrecondition, ECancelled, EResourceExhausted, EPermissionDenied,
}

// Error is a domain error with a code a caller can act on and a message a person can read.
type Error struct {
	Code    Code
	Message string
}

// Error formats as "itx.<code>: <message>", the exception reason clients parse.
func (e *Error) Error() string {
	return "itx." + string(e.Code) + ": " + e.Message
}

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err: the code of the first *Error in its chain or, for an error
// that crossed the wire, the code named in its text. Errors without one are EInternal; nil is "".
// The Go client's calls that failed because the connection was lost are EDisconnected.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if code, _, ok := parseRemote(err.Error()); ok {
		return code
	}
	return EInternal
}

// Coded reports whether err names a code: an *Error in its chain, or a remote reason with one.
// An error without one is EInternal to ErrorCode, which cannot tell it from a named internal.
func Coded(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := errors.AsType[*Error](err); ok {
		return true
	}
	_, _, ok := parseRemote(err.Error())
	return ok
}

// ErrorMessage returns the human part of err without its code prefix.
func ErrorMessage(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	if _, msg, ok := parseRemote(err.Error()); ok {
		return msg
	}
	return err.Error()
}

// AsError returns err as an *Error, decoding a remote exception's reason when needed; errors
// without a code become EInternal with err's text.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if code, msg, ok := parseRemote(err.Error()); ok {
		return &Error{Code: code, Message: msg}
	}
	return &Error{Code: EInternal, Message: err.Error()}
}

// parseRemote finds "itx.<code>: " in text. The RPC layer may prefix the reason with its own
// annotations, so the marker is searched for, not required at the start.
func parseRemote(text string) (Code, string, bool) {
	for i := strings.Index(text, "itx."); i >= 0; {
		rest := text[i+len("itx."):]
		if colon := strings.Index(rest, ": "); colon > 0 {
			code := Code(rest[:colon])
			if code == EDisconnected || slices.Contains(Codes, code) {
				return code, rest[colon+2:], true
			}
		}
		next := strings.Index(rest, "itx.")
		if next < 0 {
			break
		}
		i += len("itx.") + next
	}
	return "", "", false
}
