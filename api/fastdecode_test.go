package api

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"
)

// slowDecode is decodeBody's encoding/json path.
func slowDecode(body []byte, dst any) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(dst) != nil {
		return false
	}
	_, err := dec.Token()
	return err == io.EOF
}

// FuzzFastDecode: whenever the fast reader takes a claim or complete body,
// encoding/json takes it too and fills the request with the same values;
// whenever plainString decodes a string token, json.Unmarshal decodes it
// to the same string. (Where the fast reader gives up, decodeBody uses
// encoding/json itself, so its answers are encoding/json's.)
func FuzzFastDecode(f *testing.F) {
	for _, seed := range []string{
		`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`,
		`{"fencing_token":12,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`,
		` { "operation" : "op" , "fingerprint" : "v1:abc", "lease_seconds": 30, "attempt_id": "a-1", "wait_seconds": 0 } `,
		`{"operation":"op","request":[1,-2.5e+3,true,false,null,"\u00e9\n",{"a":{}}]}`,
		`{"fencing_token":-0,"response":{"status":200,"headers":{},"body":"aGk=","body_encoding":"base64"}}`,
		`{"response":{"body":{"not":"a string"}},"fencing_token":1}`,
		`{"Operation":"op"}`, `{"operation":"op"} x`, `{"operation":null}`, `{"lease_seconds":1.5}`,
		`{"lease_seconds":012}`, `{"lease_seconds":1e2}`, `{"operation":"op","operation":"other"}`,
		`{"response":{"status":201},"response":{"body":"x"},"fencing_token":3}`,
		`"just a string"`, `"tab\tand \"quote\" and \/ and \\ and \b\f\n\r"`, `"\u2028"`, "\"\xff\"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fastClaim, slowClaim claimRequest
		if fastClaim.decodeFast(body) {
			if !slowDecode(body, &slowClaim) {
				t.Fatalf("fast reader took a claim encoding/json refuses: %q", body)
			}
			if !reflect.DeepEqual(fastClaim, slowClaim) {
				t.Fatalf("claim %q:\nfast %#v\nslow %#v", body, fastClaim, slowClaim)
			}
		} else if !reflect.DeepEqual(fastClaim, claimRequest{}) {
			t.Fatalf("the fast reader gave up on %q but changed the request", body)
		}
		var fastComplete, slowComplete completeRequest
		if fastComplete.decodeFast(body) {
			if !slowDecode(body, &slowComplete) {
				t.Fatalf("fast reader took a complete encoding/json refuses: %q", body)
			}
			if !reflect.DeepEqual(fastComplete, slowComplete) {
				t.Fatalf("complete %q:\nfast %#v %#v\nslow %#v %#v", body, fastComplete, fastComplete.Response, slowComplete, slowComplete.Response)
			}
		} else if !reflect.DeepEqual(fastComplete, completeRequest{}) {
			t.Fatalf("the fast reader gave up on %q but changed the request", body)
		}
		if s, ok := plainString(body); ok {
			var want string
			if err := json.Unmarshal(body, &want); err != nil || s != want {
				t.Fatalf("plainString(%q) = %q, json.Unmarshal: %q, %v", body, s, want, err)
			}
		}
	})
}

// TestFastDecodeTakesTheLoadgenBodies: the bodies cmd/loadgen sends (the
// plain form of every hot-path request) are read by the fast reader, not
// left to encoding/json.
func TestFastDecodeTakesTheLoadgenBodies(t *testing.T) {
	t.Parallel()
	var c claimRequest
	if !c.decodeFast([]byte(`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`)) {
		t.Fatal("claim body left to encoding/json")
	}
	var k completeRequest
	if !k.decodeFast([]byte(`{"fencing_token":7,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`)) {
		t.Fatal("complete body left to encoding/json")
	}
	if s, ok := plainString(k.Response.Body); !ok || s != `{"id":"ord_1"}` {
		t.Fatalf("response body: %q %v", s, ok)
	}
}
