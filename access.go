package itx

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// Right is one kind of authority a token (or an attenuated capability) may carry. The values are
// the enumerant names of schema Right.
type Right string

// The rights. A scope with no rights listed carries all of them.
const (
	RightRead      Right = "read"      // reads, waitForEvent, describe, connections, live state, listings
	RightAppend    Right = "append"    // append
	RightSubscribe Right = "subscribe" // configure/remove/resume/cursor-set subscriptions, mount receivers
	RightAdmin     Right = "admin"     // the project's tokens (the deployment root: every project)
)

// Rights lists every right, for exhaustiveness checks against the schema.
var Rights = []Right{RightRead, RightAppend, RightSubscribe, RightAdmin}

// Scope is what a token allows: streams under Prefix (by segments; "" or "/" is every path) and
// the listed Rights (none listed: every right).
type Scope struct {
	Prefix string
	Rights []Right
}

// Validate checks a scope from a client: a valid path prefix and known rights.
func (s Scope) Validate() error {
	if s.Prefix != "" && s.Prefix != "/" {
		if err := ValidatePath(s.Prefix); err != nil {
			return Errorf(EInvalid, "scope prefix: %s", ErrorMessage(err))
		}
	}
	for _, r := range s.Rights {
		if !slices.Contains(Rights, r) {
			return Errorf(EInvalid, "scope: unknown right %q", r)
		}
	}
	return nil
}

// Allows reports whether the scope carries right r.
func (s Scope) Allows(r Right) bool { return len(s.Rights) == 0 || slices.Contains(s.Rights, r) }

// Whole reports whether the scope is the whole project: every path, every right.
func (s Scope) Whole() bool { return (s.Prefix == "" || s.Prefix == "/") && len(s.Rights) == 0 }

// Contains reports whether path is under the scope's prefix, by segments: "/a" holds "/a" and
// "/a/b" but not "/ab".
func (s Scope) Contains(path string) bool {
	return PathUnder(path, s.Prefix)
}

// PathUnder reports whether path is prefix or below it, by segments ("" and "/" hold every path).
func PathUnder(path, prefix string) bool {
	if prefix == "" || prefix == "/" {
		return true
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// Within reports whether every path and right of s is also one of outer: a scope handed on
// (a new token, an attenuated capability) never grows.
func (s Scope) Within(outer Scope) bool {
	if !PathUnder(orRoot(s.Prefix), outer.Prefix) {
		return false
	}
	if len(outer.Rights) == 0 {
		return true
	}
	if len(s.Rights) == 0 {
		return false
	}
	for _, r := range s.Rights {
		if !outer.Allows(r) {
			return false
		}
	}
	return true
}

func orRoot(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// TokenInfo describes a token as listings show it: never the token itself.
type TokenInfo struct {
	ID         string
	ProjectID  string
	Label      string
	CreatedAt  int64 // epoch ms
	LastUsedAt int64 // epoch ms of its last login; 0: never
	ExpiresAt  int64 // epoch ms; 0: never
	Scope      Scope
}

// Principal names who holds the token, the same for every token of one project made with the
// same label and scope: a rotation (a new token made as the old one was, the old one revoked)
// keeps the principal, so what the old token owns (a registered reader, a connection's key, a
// mounted Receiver or processor host) is the new one's too. Whoever may make such a token holds
// the admin right over that scope already, and may remove or revoke all of it anyway.
func (t TokenInfo) Principal() string {
	h := sha256.New()
	prefix := orRoot(t.Scope.Prefix)
	var rights []string
	for _, r := range Rights {
		if t.Scope.Allows(r) {
			rights = append(rights, string(r))
		}
	}
	for _, part := range []string{t.ProjectID, t.Label, prefix, strings.Join(rights, ",")} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "principal:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// ProjectSummary is a row of the administration's project list.
type ProjectSummary struct {
	Info        ProjectInfo
	CreatedAt   int64
	StreamCount int
}
