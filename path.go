package itx

import (
	"strings"
	"unicode/utf8"
)

// ValidatePath checks a stream path: "/" (the root) or "/" followed by segments separated by
// "/", each made of letters, digits and "-_.~:@+=", never "." or "..", with no empty segment and
// no trailing slash. Paths are compared byte for byte: there is no normalization, so a path is
// refused rather than silently rewritten.
func ValidatePath(path string) error {
	if path == "/" {
		return nil
	}
	if path == "" {
		return Errorf(EInvalid, "stream path must not be empty")
	}
	if len(path) > MaxPathLength {
		return Errorf(EInvalid, "stream path is %d bytes, at most %d", len(path), MaxPathLength)
	}
	if path[0] != '/' {
		return Errorf(EInvalid, "stream path %q must start with /", path)
	}
	segments := strings.Split(path[1:], "/")
	if len(segments) > MaxPathSegments {
		return Errorf(EInvalid, "stream path %q has %d segments, at most %d", path, len(segments), MaxPathSegments)
	}
	for _, s := range segments {
		switch s {
		case "":
			return Errorf(EInvalid, "stream path %q has an empty segment or a trailing slash", path)
		case ".", "..":
			return Errorf(EInvalid, "stream path %q has a %q segment", path, s)
		}
		for i := 0; i < len(s); i++ {
			if !pathByte(s[i]) {
				// Named whole: the byte alone is the start of a UTF-8 sequence for a non-ASCII
				// character (é would read 'Ã').
				r, size := utf8.DecodeRuneInString(s[i:])
				if r == utf8.RuneError && size <= 1 {
					return Errorf(EInvalid, "stream path %q: byte %#x is not allowed (not UTF-8)", path, s[i])
				}
				return Errorf(EInvalid, "stream path %q: character %q is not allowed", path, r)
			}
		}
	}
	return nil
}

func pathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-_.~:@+=", c) >= 0
}

// ValidatePathPrefix checks a Streams.list prefix: empty or "/", or a path prefix that may end
// in "/".
func ValidatePathPrefix(prefix string) error {
	if prefix == "" || prefix == "/" {
		return nil
	}
	return ValidatePath(strings.TrimSuffix(prefix, "/"))
}
