package idem_test

import (
	"bytes"
	"errors"
	"testing"

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
