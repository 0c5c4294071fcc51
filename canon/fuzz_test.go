package canon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/idem-dev/idem/canon"
)

// FuzzCanonicalJSON checks the canonical form: it never panics; it refuses
// whatever is not I-JSON (CheckIJSON) or not JSON; what it accepts
// canonicalizes to valid I-JSON that is its own canonical form
// (canonical(canonical(x)) == canonical(x)) and fingerprints the same; and
// it is the same JSON value as the input. Seeds:
// testdata/fuzz/FuzzCanonicalJSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null]}`, `{"amount":1000,"amount":1}`, "{\"name\":\"\xff\"}", `"\ud800"`,
		`"\ud83d\ude00"`, `1e21`, `-0.0`, `0.0000001`, `333333333.33333329`, `{"\ufb01":1,"\ud83d\ude00":2}`,
		`"\u0000\u001f\""`, `[1,2,[3,{"x":"y"}]]`, `1e400`, `{"a":1,"\u0061":2}`, ` null `, `{} {}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canonical, err := canon.JSON(doc)
		ijsonErr := canon.CheckIJSON(doc)
		if ijsonErr != nil && err == nil {
			t.Fatalf("JSON accepted %q, which CheckIJSON refuses: %v", doc, ijsonErr)
		}
		if err != nil {
			var ce *canon.Error
			if !errors.As(err, &ce) {
				t.Fatalf("JSON(%q) refused with %T %v, want a *canon.Error", doc, err, err)
			}
			return
		}
		if !json.Valid(doc) {
			t.Fatalf("JSON accepted invalid JSON %q", doc)
		}
		if !utf8.Valid(canonical) || canon.CheckIJSON(canonical) != nil {
			t.Fatalf("canonical form %q of %q is not I-JSON", canonical, doc)
		}
		again, err := canon.JSON(canonical)
		if err != nil {
			t.Fatalf("canonical form %q of %q is refused: %v", canonical, doc, err)
		}
		if !bytes.Equal(again, canonical) {
			t.Fatalf("canonical(canonical(%q)) = %q, want %q", doc, again, canonical)
		}
		var a, b any
		if json.Unmarshal(doc, &a) != nil || json.Unmarshal(canonical, &b) != nil {
			t.Fatalf("%q or its canonical form %q does not decode", doc, canonical)
		}
		if !reflect.DeepEqual(a, b) { // floats compare with ==, so -0 equals 0
			t.Fatalf("canonical form %q of %q is another value", canonical, doc)
		}
		fp1, err1 := canon.Fingerprint(doc)
		fp2, err2 := canon.Fingerprint(canonical)
		if err1 != nil || err2 != nil || fp1 != fp2 {
			t.Fatalf("fingerprints of %q and its canonical form differ: %s %s", doc, fp1, fp2)
		}
	})
}
