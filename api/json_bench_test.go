package api

import (
	"bytes"
	"testing"
	"time"

	"github.com/go-json-experiment/json"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/canon"
)

// jsonClaimBody and jsonCompleteBody are the claim and complete cmd/loadgen
// sends.
var jsonClaimBody = []byte(`{"operation":"POST /v1/payments","request":{"amount":1000,"currency":"usd"}}`)

var jsonCompleteBody = []byte(`{"fencing_token":1,"response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ord_1\"}"}}`)

// decodeStrict is decodeBody's decoding of a body, without the HTTP
// request around it.
func decodeStrict(b *testing.B, body []byte, dst any) {
	if err := decodeRequest(body, "application/json", dst); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLifecycleJSON is the JSON work of the two requests of
// `loadgen -mode lifecycle` without HTTP and the store: the claim's body
// decoded and checked, its request fingerprinted, its 201 written; the
// complete's body decoded and checked, its response read, the record
// written. It is what issue 22 moved onto libraries. Run with -benchmem.
func BenchmarkLifecycleJSON(b *testing.B) {
	now := time.Now()
	var out bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		var claim claimRequest
		decodeStrict(b, jsonClaimBody, &claim)
		if _, err := canon.Fingerprint(claim.Request); err != nil {
			b.Fatal(err)
		}
		out.Reset()
		if err := json.MarshalWrite(&out, claimJSON{Key: "k-1", State: idem.StateInFlight, FencingToken: 1, Attempt: 1, LeaseExpiresAt: timeJSON(now)}, answerOptions); err != nil {
			b.Fatal(err)
		}
		var complete completeRequest
		decodeStrict(b, jsonCompleteBody, &complete)
		resp, err := complete.Response.decode()
		if err != nil {
			b.Fatal(err)
		}
		out.Reset()
		rec := idem.Record{Key: "k-1", State: idem.StateCompleted, Operation: "POST /v1/payments", Fingerprint: "sha256:ab", FencingToken: 1, Attempt: 1,
			CreatedAt: now, CompletedAt: now, ReplayUntil: now, PurgeAfter: now, Response: &resp}
		if err := json.MarshalWrite(&out, encodeRecord(rec), answerOptions); err != nil {
			b.Fatal(err)
		}
	}
}
