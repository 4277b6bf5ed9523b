package repl

import (
	"sort"
	"strings"
)

// nearest is the candidate a mistyped word most likely meant: the one fewest edits away
// (insertions, deletions, substitutions; a letter's case costs nothing), at most one edit for
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

func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// withNameHint adds to a ReferenceError for a name the prompt does not know the name it most
// likely meant (prject: did you mean project?).
func (s *Session) withNameHint(f Failure) Failure {
	name, ok := strings.CutSuffix(f.Message, " is not defined")
	if f.Code != "ReferenceError" || !ok || strings.ContainsAny(name, " (") {
		return f
	}
	var names []string
	for _, n := range s.globalNames() {
		names = append(names, strings.TrimSuffix(n, "("))
	}
	if guess := nearest(name, names); guess != "" {
		f.Message += " (did you mean " + guess + "?)"
	}
	return f
}
