package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestAppendJSONMatchesEncodingJSON: the hand-written bodies are byte for
// byte what json.Encoder writes, on random records and claims whose strings
// hold every class of character encoding/json treats specially (quotes,
// backslashes, control characters, <>&, U+2028/2029, invalid UTF-8,
// multi-byte runes), whose times are zero (null) or fall in any year of
// ±1000 around 1970 in any zone with or without a fraction, and whose
// optional members are present or absent.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 1))
	pieces := []string{
		"", "a", "order-42", `"`, `\`, "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "<", ">", "&",
		"\u2028", "\u2029", "\xff", "\xe2\x80", "é", "日本", "😀", "\ufffd", `{"id":"ord_1"}`, "2026-11-30T13:00:00.123456Z",
	}
	str := func() string {
		var s string
		for range rng.IntN(6) {
			s += pieces[rng.IntN(len(pieces))]
		}
		return s
	}
	opt := func() *string {
		if rng.IntN(3) == 0 {
			return nil
		}
		s := str()
		return &s
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 2*3600), time.FixedZone("", -(9*3600 + 1800))}
	optTime := func() jsonTime {
		if rng.IntN(3) == 0 {
			return jsonTime{}
		}
		return jsonTime(randomTime(rng, zones))
	}
	encode := func(v any) []byte {
		var buf bytes.Buffer
		if err := json.NewEncoder(&buf).Encode(v); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	for i := range 5000 {
		c := claimJSON{
			Key: str(), State: idem.State(str()), FencingToken: rng.Int64() - rng.Int64(), Attempt: rng.IntN(100) - 1,
			Resumed: rng.IntN(2) == 0, LeaseExpiresAt: optTime(), RecoveryPoint: opt(),
		}
		got, ok := appendBody(nil, c)
		if !ok || !bytes.Equal(got, encode(c)) {
			t.Fatalf("claim %d: ok=%v\n got %s\nwant %s", i, ok, got, encode(c))
		}
		r := recordJSON{
			Key: str(), State: idem.State(str()), Operation: str(), Fingerprint: str(),
			FencingToken: rng.Int64(), Attempt: rng.IntN(100), LeaseExpiresAt: optTime(), RecoveryPoint: opt(),
			RecoveryData: recoveryJSON{omitted: rng.IntN(2) == 0},
			CreatedAt:    optTime(), CompletedAt: optTime(), ReplayUntil: optTime(), PurgeAfter: optTime(),
		}
		if rng.IntN(4) > 0 {
			r.Response = &responseJSON{Status: 100 + rng.IntN(500), Body: str(), BodyEncoding: str()}
			if rng.IntN(4) > 0 {
				r.Response.Headers = map[string]string{}
				for range rng.IntN(5) {
					r.Response.Headers[str()] = str()
				}
			}
		}
		if rng.IntN(3) == 0 {
			r.Review = &reviewJSON{Note: str(), At: optTime()}
		}
		got, ok = appendBody(nil, r)
		if !ok || !bytes.Equal(got, encode(r)) {
			t.Fatalf("record %d: ok=%v\n got %s\nwant %s", i, ok, got, encode(r))
		}
	}
	// Saved recovery data is left to encoding/json (it compacts it).
	_, ok := appendBody(nil, recordJSON{RecoveryData: recoveryJSON{raw: json.RawMessage(`{"a": 1}`)}})
	if ok {
		t.Fatal("a record with recovery data was written by hand")
	}
	_, ok = appendBody(nil, claimJSON{RecoveryData: json.RawMessage(`{"a": 1}`)})
	if ok {
		t.Fatal("a claim with recovery data was written by hand")
	}
	// Only the exact types: an orphan embeds recordJSON but has a tenant.
	if _, ok := appendBody(nil, orphanJSON{}); ok {
		t.Fatal("an orphan was written as a record")
	}
}

// randomTime is a time within about a thousand years of 1970 in one of
// zones, with no fraction or one of up to nine digits.
func randomTime(rng *rand.Rand, zones []*time.Location) time.Time {
	nanos := rng.Int64N(int64(time.Second))
	nanos -= nanos % []int64{1, 1e3, 1e6, 1e8, 1e9}[rng.IntN(5)]
	return time.Unix(rng.Int64N(1<<36)-1<<35, nanos).In(zones[rng.IntN(len(zones))])
}

// TestTimeJSONIsRFC3339NanoUTC: a time is written as the string
// t.UTC().Format(time.RFC3339Nano) was, and the zero time as null, by both
// appendTime and MarshalJSON.
func TestTimeJSONIsRFC3339NanoUTC(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(14, 4))
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+2700), time.FixedZone("", -3600)}
	for range 3000 {
		tm := randomTime(rng, zones)
		s := tm.UTC().Format(time.RFC3339Nano)
		want, err := json.Marshal(&s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(timeJSON(tm))
		if err != nil || string(got) != string(want) || string(appendTime(nil, timeJSON(tm))) != string(want) {
			t.Fatalf("%v: got %s, %s (%v), want %s", tm, got, appendTime(nil, timeJSON(tm)), err, want)
		}
	}
	if got, err := json.Marshal(timeJSON(time.Time{})); err != nil || string(got) != "null" {
		t.Fatalf("zero time: %s, %v", got, err)
	}
}
