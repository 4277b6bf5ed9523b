package repl

import (
	"sort"
	"strings"
)

// nearest is the candidate a mistyped word most likely meant: the one fewest edits away
// (insertions, deletions, substitutions, swaps of neighbours; a letter's case costs nothing), at most one edit for
// a word of up to four letters and two for a longer one. "" when none is that close: a hint
// that guesses wildly is worse than none.
func nearest(word string, candidates []string) string {
	limit := 2
	if len([]rune(word)) <= 4 {
		limit = 1
	}
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestDist := "", limit+1
	for _, c := range sorted {
		if c == word {
			continue
		}
		if d := editDistance(strings.ToLower(word), strings.ToLower(c)); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// Nearest is nearest for itx's own command line (itx tial /a: did you mean itx tail?).
func Nearest(word string, candidates []string) string { return nearest(word, candidates) }

// editDistance counts the insertions, deletions, substitutions and swaps of two neighbours
// (tial for tail) that make a into b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// withNameHint adds to a ReferenceError for a name the prompt does not know the name it most
// likely meant (prject: did you mean project?), in a script too.
func (s *Session) withNameHint(f Failure) Failure {
	name, where, ok := strings.Cut(f.Message, " is not defined")
	if f.Code != "ReferenceError" || !ok || strings.ContainsAny(name, " (") || (where != "" && !strings.HasPrefix(where, " (at ")) {
		return f
	}
	var names []string
	for _, n := range s.globalNames() {
		names = append(names, strings.TrimSuffix(n, "("))
	}
	if guess := nearest(name, names); guess != "" {
		f.Message = name + " is not defined (did you mean " + guess + "?)" + where // where: a script's (at file:line:col)
	}
	return f
}
