// Package glob matches the patterns of storeguard's configuration: policy rules' keys (* and ?)
// and identity patterns' segments (* only), in O(len(pattern)·len(s)) with no allocation.
package glob

// Match reports whether s matches pattern, where * is any run of bytes and ? any one byte.
func Match[T ~string | ~[]byte](pattern, s T) bool { return match(pattern, s, true) }

// Star reports whether s matches pattern, where * is any run of bytes and every other byte, ?
// included, is itself.
func Star[T ~string | ~[]byte](pattern, s T) bool { return match(pattern, s, false) }

func match[T ~string | ~[]byte](pattern, s T, one bool) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*': // before the literal case: a * of s is not the star's end
			star, mark = p, i
			p++
		case p < len(pattern) && (one && pattern[p] == '?' || pattern[p] == s[i]):
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
