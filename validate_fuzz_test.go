package itx_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/itx-dev/itx"
)

// FuzzValidatePath checks stream paths: a refusal is typed and deterministic; an accepted path
// keeps every documented rule, and is a valid list prefix with or without a trailing slash.
func FuzzValidatePath(f *testing.F) {
	for _, s := range []string{"/", "/a", "/a/b-c_d.e~f:g@h+i=j", "", "a", "//", "/a/", "/a/./b", "/..", "/a b",
		"/é", "/a\x00", strings.Repeat("/a", itx.MaxPathSegments+1), "/" + strings.Repeat("x", itx.MaxPathLength)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		err := itx.ValidatePath(path)
		if err2 := itx.ValidatePath(path); (err == nil) != (err2 == nil) {
			t.Fatalf("ValidatePath(%q) is not deterministic", path)
		}
		if perr := itx.ValidatePathPrefix(path); perr != nil {
			requireTyped(t, perr, itx.EInvalid)
		}
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		if itx.ValidatePathPrefix(path) != nil || itx.ValidatePathPrefix(strings.TrimSuffix(path, "/")+"/") != nil {
			t.Fatalf("accepted path %q is not a valid prefix", path)
		}
		if path == "/" {
			return
		}
		if len(path) > itx.MaxPathLength || path[0] != '/' || strings.HasSuffix(path, "/") {
			t.Fatalf("accepted path %q breaks a rule", path)
		}
		segs := strings.Split(path[1:], "/")
		if len(segs) > itx.MaxPathSegments {
			t.Fatalf("accepted path %q has %d segments", path, len(segs))
		}
		for _, s := range segs {
			if s == "" || s == "." || s == ".." || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~:@+=") != "" {
				t.Fatalf("accepted path %q has the segment %q", path, s)
			}
		}
		if !itx.PathUnder(path, path) || !itx.PathUnder(path+"/x", path) || itx.PathUnder(path+"x", path) {
			t.Fatalf("PathUnder disagrees with segments for %q", path)
		}
	})
}

// FuzzValidateName checks caller-chosen names (subscriptions, mounts, connection keys, readers,
// projects, token labels): a refusal is typed; an accepted name is trimmed valid UTF-8 of
// 1..MaxSubscriptionNameLength characters without control characters or line separators, and
// survives the JSON the log stores it in.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"orders", "a b", " a", "a\t", "", "a\nb", "a\u2028b", "👩\u200d💻", "\xff",
		strings.Repeat("é", itx.MaxSubscriptionNameLength), strings.Repeat("é", itx.MaxSubscriptionNameLength+1), "a\u0085b", "\u00a0a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := itx.ValidateName("subscription name", name)
		if err != nil {
			requireTyped(t, err, itx.EInvalid)
			return
		}
		if !utf8.ValidString(name) || strings.TrimSpace(name) != name || name == "" || utf8.RuneCountInString(name) > itx.MaxSubscriptionNameLength {
			t.Fatalf("accepted name %q breaks a rule", name)
		}
		for _, r := range name {
			if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
				t.Fatalf("accepted name %q holds %U", name, r)
			}
		}
		b, err := json.Marshal(name)
		var back string
		if err != nil || json.Unmarshal(b, &back) != nil || back != name {
			t.Fatalf("accepted name %q does not survive JSON: %q", name, back)
		}
	})
}
