package idem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/idem-dev/idem"
)

// FuzzValidateKey checks that ValidateKey never panics, accepts exactly the
// keys of 1-255 bytes in 0x21-0x7E, and refuses everything else with
// invalid_key. Seeds: testdata/fuzz/FuzzValidateKey.
func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"order-42", "", " ", "a b", "\x00", "é", "~!", string(bytes.Repeat([]byte("k"), 256))} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idem.ValidateKey(key)
		want := len(key) >= 1 && len(key) <= idem.MaxKeyBytes
		for i := 0; i < len(key) && want; i++ {
			want = key[i] >= 0x21 && key[i] <= 0x7E
		}
		if want != (err == nil) {
			t.Fatalf("ValidateKey(%q) = %v, want accepted=%v", key, err, want)
		}
		if err != nil && !errors.Is(err, idem.ErrInvalidKey) {
			t.Fatalf("ValidateKey(%q) = %v, want invalid_key", key, err)
		}
	})
}

// FuzzCanonicalJSON checks the canonical form: it never panics; it refuses
// whatever is not I-JSON (CheckIJSON) or not JSON; what it accepts
// canonicalizes to valid I-JSON that is its own canonical form
// (canonical(canonical(x)) == canonical(x)) and fingerprints the same; and
// it is the same JSON value as the input; and its one-pass path gives what
// the two-pass path gives, bytes and error alike; CheckIJSON says what its
// earlier scanner said. Seeds: testdata/fuzz/FuzzCanonicalJSON.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null]}`, `{"amount":1000,"amount":1}`, "{\"name\":\"\xff\"}", `"\ud800"`,
		`"\ud83d\ude00"`, `1e21`, `-0.0`, `0.0000001`, `333333333.33333329`, `{"\ufb01":1,"\ud83d\ude00":2}`,
		`"\u0000\u001f\""`, `[1,2,[3,{"x":"y"}]]`, `1e400`, `{"a":1,"\u0061":2}`, ` null `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		canon, err := idem.CanonicalJSON(doc)
		checkCanonicalPaths(t, doc, canon, err)
		checkIJSONMatches(t, doc)
		ijsonErr := idem.CheckIJSON(doc)
		if err != nil {
			return
		}
		if ijsonErr != nil {
			t.Fatalf("CanonicalJSON accepted %q, which CheckIJSON refuses: %v", doc, ijsonErr)
		}
		if !json.Valid(doc) {
			t.Fatalf("CanonicalJSON accepted invalid JSON %q", doc)
		}
		if !utf8.Valid(canon) || idem.CheckIJSON(canon) != nil {
			t.Fatalf("canonical form %q of %q is not I-JSON", canon, doc)
		}
		again, err := idem.CanonicalJSON(canon)
		if err != nil {
			t.Fatalf("canonical form %q of %q is refused: %v", canon, doc, err)
		}
		if !bytes.Equal(again, canon) {
			t.Fatalf("canonical(canonical(%q)) = %q, want %q", doc, again, canon)
		}
		var a, b any
		if json.Unmarshal(doc, &a) != nil || json.Unmarshal(canon, &b) != nil {
			t.Fatalf("%q or its canonical form %q does not decode", doc, canon)
		}
		if !reflect.DeepEqual(a, b) { // floats compare with ==, so -0 equals 0
			t.Fatalf("canonical form %q of %q is another value", canon, doc)
		}
		fp1, err1 := idem.FingerprintJSON(doc)
		fp2, err2 := idem.FingerprintJSON(canon)
		if err1 != nil || err2 != nil || fp1 != fp2 {
			t.Fatalf("fingerprints of %q and its canonical form differ: %s %s", doc, fp1, fp2)
		}
	})
}
