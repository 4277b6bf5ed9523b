package itx_test

import (
	"testing"

	"github.com/itx-dev/itx"
)

// scopeOf builds a scope from a prefix and a bit set of itx.Rights (0: none listed, every right).
func scopeOf(prefix string, rights uint8) itx.Scope {
	s := itx.Scope{Prefix: prefix}
	for i, r := range itx.Rights {
		if rights&(1<<i) != 0 {
			s.Rights = append(s.Rights, r)
		}
	}
	return s
}

// FuzzScope checks token scopes as a client asks for them (Admin.createToken, attenuation):
// a refusal is EInvalid; for valid scopes a and b, a.Within(b) means a never reaches a path or
// a right b does not (a scope handed on never grows), every scope is within itself and within
// the whole project, and Within is transitive.
func FuzzScope(f *testing.F) {
	for _, s := range []struct {
		p1      string
		r1      uint8
		p2      string
		r2      uint8
		path, c string
	}{
		{"/a", 1, "", 0, "/a/b", "/"},
		{"/a/b", 3, "/a", 7, "/ab", "/a"},
		{"/", 0, "/a", 1, "/a", ""},
		{"/ab", 0, "/a", 0, "/ab/c", "/"},
		{"/a/", 0, "a", 0, "/a", "/a/"},
		{"", 16, "/x", 0, "/x/y", "/x/y"},
	} {
		f.Add(s.p1, s.r1, s.p2, s.r2, s.path, s.c)
	}
	f.Fuzz(func(t *testing.T, p1 string, r1 uint8, p2 string, r2 uint8, path, p3 string) {
		a, b := scopeOf(p1, r1&15), scopeOf(p2, r2&15)
		if r1&16 != 0 {
			a.Rights = append(a.Rights, itx.Right("root")) // a right this side does not know
		}
		errA, errB := a.Validate(), b.Validate()
		for _, err := range []error{errA, errB} {
			if err != nil {
				requireTyped(t, err, itx.EInvalid)
			}
		}
		if errA != nil || errB != nil {
			return
		}
		whole := itx.Scope{}
		if !a.Within(a) || !a.Within(whole) {
			t.Fatalf("%+v is not within itself or the whole project", a)
		}
		if a.Within(b) {
			if itx.ValidatePath(path) == nil && a.Contains(path) && !b.Contains(path) {
				t.Fatalf("%+v is within %+v but reaches %s, which it does not", a, b, path)
			}
			for _, r := range itx.Rights {
				if a.Allows(r) && !b.Allows(r) {
					t.Fatalf("%+v is within %+v but allows %s, which it does not", a, b, r)
				}
			}
			if c := scopeOf(p3, r2>>4); c.Validate() == nil && b.Within(c) && !a.Within(c) {
				t.Fatalf("Within is not transitive: %+v in %+v in %+v", a, b, c)
			}
		}
	})
}
