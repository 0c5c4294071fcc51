package idem

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// canonicalOnePass is CanonicalJSON's fast path: it reads doc once, checking
// JSON syntax and I-JSON as it goes, and writes the canonical form while it
// reads (the two-pass path decodes with encoding/json into maps, checks
// I-JSON in a second pass, then writes). It only ever says yes: on anything
// it does not accept — not JSON, not I-JSON, a number outside the double
// range — it reports false, and CanonicalJSON runs the two-pass path, which
// names the problem exactly as before. Where it says yes the two-pass path
// gives the same bytes (FuzzCanonicalJSON and TestCanonicalOnePassMatches
// compare the two).
func canonicalOnePass(dst, doc []byte) ([]byte, bool) {
	sc := jcsScratchPool.Get().(*jcsScratch)
	j := jcs{ijsonScanner: ijsonScanner{data: doc}, out: dst, jcsScratch: *sc}
	j.skipSpace()
	ok := j.value()
	if ok {
		j.skipSpace()
		ok = j.pos == len(j.data)
	}
	if cap(j.keys)+cap(j.tmp) <= maxPooledScratch {
		*sc = jcsScratch{keys: j.keys[:0], members: j.members[:0], tmp: j.tmp[:0]}
		jcsScratchPool.Put(sc)
	}
	return j.out, ok
}

// jcs is the one-pass canonicalizer's state. It reuses the I-JSON scanner's
// reading (white space, escapes, number syntax).
type jcs struct {
	ijsonScanner
	jcsScratch
	out []byte
}

// jcsScratch is the one-pass canonicalizer's working memory, kept in a
// pool between documents.
type jcsScratch struct {
	// keys holds the unescaped member names of the objects being read;
	// members the members of those objects, innermost last.
	keys    []byte
	members []jcsMember
	// tmp is where an object's members are copied while they are put in
	// order.
	tmp []byte
}

var jcsScratchPool = sync.Pool{New: func() any { return new(jcsScratch) }}

// maxPooledScratch is the most scratch memory put back in the pool (a
// document with long names or a large unordered object is let go).
const maxPooledScratch = 64 << 10

// jcsMember is one member of an object being read: its unescaped name in
// keys and its canonical `"name":value` in out.
type jcsMember struct {
	nameStart, nameEnd int
	start, end         int
}

func (j *jcs) value() bool {
	if j.pos >= len(j.data) {
		return false
	}
	switch c := j.data[j.pos]; {
	case c == '{':
		return j.object()
	case c == '[':
		return j.array()
	case c == '"':
		return j.str(false)
	case c == '-' || c >= '0' && c <= '9':
		return j.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if bytes.HasPrefix(j.data[j.pos:], []byte(lit)) {
				j.pos += len(lit)
				j.out = append(j.out, lit...)
				return true
			}
		}
		return false
	}
}

func (j *jcs) array() bool {
	if empty, err := j.open(']'); err != nil {
		return false
	} else if empty {
		j.out = append(j.out, "[]"...)
		return true
	}
	j.out = append(j.out, '[')
	for {
		j.skipSpace()
		if !j.value() {
			return false
		}
		done, err := j.next(']')
		if err != nil {
			return false
		}
		if done {
			j.out = append(j.out, ']')
			return true
		}
		j.out = append(j.out, ',')
	}
}

func (j *jcs) object() bool {
	if empty, err := j.open('}'); err != nil {
		return false
	} else if empty {
		j.out = append(j.out, "{}"...)
		return true
	}
	objStart := len(j.out)
	j.out = append(j.out, '{')
	base, namesBase := len(j.members), len(j.keys)
	for {
		j.skipSpace()
		if j.pos >= len(j.data) || j.data[j.pos] != '"' {
			return false
		}
		m := jcsMember{nameStart: len(j.keys), start: len(j.out)}
		if !j.str(true) {
			return false
		}
		m.nameEnd = len(j.keys)
		j.skipSpace()
		if j.pos >= len(j.data) || j.data[j.pos] != ':' {
			return false
		}
		j.pos++
		j.out = append(j.out, ':')
		j.skipSpace()
		if !j.value() {
			return false
		}
		m.end = len(j.out)
		j.members = append(j.members, m)
		done, err := j.next('}')
		if err != nil {
			return false
		}
		if done {
			break
		}
		j.out = append(j.out, ',')
	}
	ms := j.members[base:]
	name := func(m jcsMember) []byte { return j.keys[m.nameStart:m.nameEnd] }
	cmpMembers := func(a, b jcsMember) int { return compareUTF16(name(a), name(b)) }
	if !slices.IsSortedFunc(ms, cmpMembers) {
		slices.SortFunc(ms, cmpMembers)
		// Write the members again in order, from a copy of the object.
		j.tmp = append(j.tmp[:0], j.out[objStart:]...)
		j.out = append(j.out[:objStart], '{')
		for i, m := range ms {
			if i > 0 {
				j.out = append(j.out, ',')
			}
			j.out = append(j.out, j.tmp[m.start-objStart:m.end-objStart]...)
		}
	}
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(name(ms[i-1]), name(ms[i])) {
			return false // a duplicate member name: not I-JSON
		}
	}
	j.out = append(j.out, '}')
	j.members, j.keys = j.members[:base], j.keys[:namesBase]
	return true
}

// str reads the string whose opening quote is at j.pos and writes its
// canonical form; a member name's unescaped text also goes to j.keys.
func (j *jcs) str(isName bool) bool {
	j.pos++
	j.out = append(j.out, '"')
	for j.pos < len(j.data) {
		// A run of bytes that stay as they are.
		start := j.pos
		for j.pos < len(j.data) {
			c := j.data[j.pos]
			if c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
				break
			}
			j.pos++
		}
		j.out = append(j.out, j.data[start:j.pos]...)
		if isName {
			j.keys = append(j.keys, j.data[start:j.pos]...)
		}
		if j.pos >= len(j.data) {
			break
		}
		switch c := j.data[j.pos]; {
		case c == '"':
			j.pos++
			j.out = append(j.out, '"')
			return true
		case c < 0x20:
			return false
		case c == '\\':
			r, err := j.escape()
			if err != nil || r < 0 { // bad escape, or a lone surrogate
				return false
			}
			j.out = appendCanonicalRune(j.out, r)
			if isName {
				j.keys = utf8.AppendRune(j.keys, r)
			}
		default:
			r, size := utf8.DecodeRune(j.data[j.pos:])
			if r == utf8.RuneError && size == 1 {
				return false
			}
			j.out = append(j.out, j.data[j.pos:j.pos+size]...)
			if isName {
				j.keys = append(j.keys, j.data[j.pos:j.pos+size]...)
			}
			j.pos += size
		}
	}
	return false
}

// number reads a number and writes it in ECMAScript's form. An integer of
// at most 15 digits (exact in a double, below 1e21) is already in that
// form, except -0.
func (j *jcs) number() bool {
	start := j.pos
	plain := true // only digits after an optional minus
	for j.pos < len(j.data) {
		c := j.data[j.pos]
		if c >= '0' && c <= '9' || c == '-' && j.pos == start {
			j.pos++
			continue
		}
		if c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			plain = false
			j.pos++
			continue
		}
		break
	}
	lit := j.data[start:j.pos]
	if !validJSONNumber(lit) {
		return false
	}
	digits := len(lit)
	if lit[0] == '-' {
		digits--
	}
	if plain && digits <= 15 && string(lit) != "-0" {
		j.out = append(j.out, lit...)
		return true
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return false // out of the double range
	}
	j.out = appendES6Number(j.out, f)
	return true
}
