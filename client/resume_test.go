package client_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
)

const resumeSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// signedCall posts body to h signed with secret at ts.
func signedCall(t *testing.T, h http.Handler, secret string, ts time.Time, body string) *httptest.ResponseRecorder {
	t.Helper()
	return signedCallCtx(t, context.Background(), h, secret, ts, body)
}

func signedCallCtx(t *testing.T, ctx context.Context, h http.Handler, secret string, ts time.Time, body string) *httptest.ResponseRecorder {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	stamp := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("rsm_1." + stamp + "." + body))
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/resume", strings.NewReader(body))
	req.Header.Set("webhook-id", "rsm_1")
	req.Header.Set("webhook-timestamp", stamp)
	req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

const resumeBody = `{"type":"key.resume","tenant":"acme","key":"order-1","operation":"POST /orders","attempt":1,"max_attempts":8,` +
	`"fencing_token":42,"recovery_point":"charged","recovery_data":{"charge":"ch_1"},"lease_expires_at":"2099-12-01T23:00:00Z","deadline":"2099-12-02T01:00:00Z"}`

// The handler runs the function only for a call signed with the secret
// and stamped within the tolerance (401 otherwise), hands it a resumed
// claim under the call's token, and answers each outcome per the protocol.
func TestResumeHandler(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	var ran int
	outcome := func(err error) client.ResumeFunc {
		return func(_ context.Context, call client.ResumeCall, claim *client.Claim) (client.Response, error) {
			ran++
			if claim.FencingToken() != 42 || !claim.Resumed() || claim.RecoveryPoint() != "charged" ||
				string(claim.RecoveryData()) != `{"charge":"ch_1"}` || call.Operation != "POST /orders" || call.Attempt != 1 {
				t.Errorf("claim/call = %d %v %q %s %+v", claim.FencingToken(), claim.Resumed(), claim.RecoveryPoint(), claim.RecoveryData(), call)
			}
			return client.Response{Status: 201, Body: []byte("done")}, err
		}
	}
	now := time.Now()
	for _, tc := range []struct {
		name   string
		secret string
		at     time.Time
		status int
	}{
		{"wrong secret", "whsec_" + base64.StdEncoding.EncodeToString([]byte("another key of 24 bytes!")), now, 401},
		{"too old", resumeSecret, now.Add(-6 * time.Minute), 401},
		{"too new", resumeSecret, now.Add(6 * time.Minute), 401},
	} {
		w := signedCall(t, c.ResumeHandler(resumeSecret, outcome(nil)), tc.secret, tc.at, resumeBody)
		if w.Code != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, w.Code, tc.status)
		}
	}
	if ran != 0 {
		t.Fatalf("the function ran %d times for refused calls", ran)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, `"outcome":"completed"`},
		{client.ErrNoSideEffect, `"outcome":"not_done"`},
		{client.NeedsReview("charged twice?"), `"note":"charged twice?"`},
		{client.RetryLater(30*time.Second, nil), `"retry_after_seconds":30`},
		{errors.New("psp timeout"), `"outcome":"unknown"`},
	} {
		w := signedCall(t, c.ResumeHandler(resumeSecret, outcome(tc.err)), resumeSecret, now, resumeBody)
		b, _ := io.ReadAll(w.Body)
		var a map[string]any
		if w.Code != 200 || json.Unmarshal(b, &a) != nil || !strings.Contains(string(b), tc.want) {
			t.Errorf("%v: %d %s, want %s", tc.err, w.Code, b, tc.want)
		}
	}
	if ran != 5 {
		t.Fatalf("ran %d times, want 5", ran)
	}

	// The completer hanging up (its replica died) does not cut the work
	// short before the completer's lease ends: it gets to its checkpoint.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	var alive bool
	h := c.ResumeHandler(resumeSecret, func(ctx context.Context, _ client.ResumeCall, _ *client.Claim) (client.Response, error) {
		alive = ctx.Err() == nil
		_, hasDeadline := ctx.Deadline()
		alive = alive && hasDeadline
		return client.Response{Status: 200}, nil
	})
	signedCallCtx(t, gone, h, resumeSecret, now, resumeBody)
	if !alive {
		t.Fatal("the function's context ended with the request's, or has no deadline (the completer's lease)")
	}
}

// The answer's note is fixed text, never the function's error or panic
// value: those may hold a secret (a PSP's message with a key, a DSN), and
// the note leaves the app for idem. Over real HTTP.
func TestResumeHandlerNoteHoldsNoSecret(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	const secret = "sk_live_51HsecretPSPkey"
	for name, fn := range map[string]client.ResumeFunc{
		"error": func(context.Context, client.ResumeCall, *client.Claim) (client.Response, error) {
			return client.Response{}, errors.New("psp refused: key " + secret)
		},
		"retry later": func(context.Context, client.ResumeCall, *client.Claim) (client.Response, error) {
			return client.Response{}, client.RetryLater(time.Second, errors.New("psp down, dsn postgres://u:"+secret+"@db"))
		},
		"panic": func(context.Context, client.ResumeCall, *client.Claim) (client.Response, error) {
			panic("token " + secret)
		},
	} {
		srv := httptest.NewServer(c.ResumeHandler(resumeSecret, fn))
		key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(resumeSecret, "whsec_"))
		stamp := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte("rsm_2." + stamp + "." + resumeBody))
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/resume", strings.NewReader(resumeBody))
		req.Header.Set("webhook-id", "rsm_2")
		req.Header.Set("webhook-timestamp", stamp)
		req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		srv.Close()
		var a struct{ Outcome, Note string }
		if res.StatusCode != 200 || json.Unmarshal(b, &a) != nil || a.Outcome != "unknown" || a.Note == "" {
			t.Errorf("%s: %d %s, want 200 unknown with a note", name, res.StatusCode, b)
		}
		if strings.Contains(string(b), secret) {
			t.Errorf("%s: the answer carries the function's secret: %s", name, b)
		}
	}
}

// A signed call replayed within the tolerance (same webhook-id) is
// refused with 401 and the function does not run again; a new id runs.
// Over real HTTP.
func TestResumeHandlerRefusesReplayedID(t *testing.T) {
	c, err := client.New("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	srv := httptest.NewServer(c.ResumeHandler(resumeSecret, func(context.Context, client.ResumeCall, *client.Claim) (client.Response, error) {
		ran.Add(1)
		return client.Response{Status: 201}, nil
	}))
	t.Cleanup(srv.Close)
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(resumeSecret, "whsec_"))
	stamp := strconv.FormatInt(time.Now().Unix(), 10)
	send := func(id string) int {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + stamp + "." + resumeBody))
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/resume", strings.NewReader(resumeBody))
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", stamp)
		req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if got := send("rsm_a"); got != 200 {
		t.Fatalf("first call: %d", got)
	}
	if got := send("rsm_a"); got != 401 {
		t.Fatalf("replayed call: %d, want 401", got)
	}
	if got := send("rsm_b"); got != 200 {
		t.Fatalf("a new id: %d", got)
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("the function ran %d times, want 2 (the replay refused)", n)
	}
}
