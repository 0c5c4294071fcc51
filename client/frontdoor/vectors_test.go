package frontdoor_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client/frontdoor"
)

// vectorDir holds the vectors shared with the Python and Node middleware.
var vectorDir = filepath.Join("..", "..", "testvectors", "frontdoor")

func load(t *testing.T, name string, dst any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, name))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, dst))
}

func codeOf(t *testing.T, err error) string {
	t.Helper()
	var e *frontdoor.Error
	require.True(t, errors.As(err, &e), "error %v is not a *frontdoor.Error", err)
	return string(e.Code)
}

type keyVector struct {
	Name         string   `json:"name"`
	HeaderValues []string `json:"header_values"`
	Scope        *string  `json:"scope"`
	Expect       struct {
		Key   *string `json:"key"`
		Error string  `json:"error"`
	} `json:"expect"`
}

func TestKeyVectors(t *testing.T) {
	var file struct {
		Vectors []keyVector `json:"vectors"`
	}
	load(t, "keys.json", &file)
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			key, err := frontdoor.ParseKey(v.HeaderValues)
			if err == nil && v.Scope != nil && key != "" {
				key, err = frontdoor.ScopedKey(*v.Scope, key)
			}
			if v.Expect.Error != "" {
				require.Error(t, err, "key %q", key)
				assert.Equal(t, v.Expect.Error, codeOf(t, err))
				return
			}
			require.NoError(t, err)
			if v.Expect.Key == nil {
				assert.Empty(t, key)
			} else {
				assert.Equal(t, *v.Expect.Key, key)
			}
		})
	}
}

// FingerprintVector is one vector of fingerprint.json.
type fingerprintVector struct {
	Name        string              `json:"name"`
	Method      string              `json:"method"`
	Route       string              `json:"route"`
	Path        string              `json:"path"`
	Query       string              `json:"query"`
	ContentType *string             `json:"content_type"`
	Body        *string             `json:"body"`
	BodyBase64  *string             `json:"body_base64"`
	Headers     map[string][]string `json:"headers"`
	Rules       frontdoor.Rules     `json:"rules"`
	Expect      struct {
		Operation   string          `json:"operation"`
		Document    json.RawMessage `json:"document"`
		Fingerprint string          `json:"fingerprint"`
		Error       string          `json:"error"`
	} `json:"expect"`
}

func (v fingerprintVector) parts(t *testing.T) frontdoor.Parts {
	p := frontdoor.Parts{Path: v.Path, Query: v.Query, Header: http.Header{}}
	if v.ContentType != nil {
		p.ContentType = *v.ContentType
	}
	switch {
	case v.Body != nil:
		p.Body = []byte(*v.Body)
	case v.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*v.BodyBase64)
		require.NoError(t, err)
		p.Body = b
	}
	for k, vs := range v.Headers {
		for _, x := range vs {
			p.Header.Add(k, x)
		}
	}
	return p
}

func TestFingerprintVectors(t *testing.T) {
	var file struct {
		Vectors []fingerprintVector `json:"vectors"`
	}
	load(t, "fingerprint.json", &file)
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			require.NoError(t, v.Rules.Validate())
			parts := v.parts(t)
			doc, err := frontdoor.Document(parts, v.Rules)
			if v.Expect.Error != "" {
				if err != nil {
					assert.Equal(t, v.Expect.Error, codeOf(t, err))
					return
				}
				// Well-formed but not I-JSON: the body must reach the
				// fingerprinter byte for byte (testvectors/fingerprint_test.go
				// proves idem.FingerprintJSON refuses it; with exclusions,
				// TestDocumentExclusionKeepsTheRestRaw).
				if len(v.Rules.Exclude) > 0 {
					return
				}
				var got struct {
					Body json.RawMessage `json:"body"`
				}
				require.NoError(t, json.Unmarshal(doc, &got))
				assert.Equal(t, string(bytes.TrimSpace(parts.Body)), string(got.Body))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, v.Expect.Operation, frontdoor.Operation(v.Method, v.Route))
			var got, want any
			require.NoError(t, json.Unmarshal(doc, &got))
			require.NoError(t, json.Unmarshal(v.Expect.Document, &want))
			assert.Equal(t, want, got)
		})
	}
}

func TestPolicyVectors(t *testing.T) {
	var file struct {
		DefaultStoredHeaders []string `json:"default_stored_headers"`
		Requirements         []struct {
			Method string `json:"method"`
			Expect string `json:"expect"`
		} `json:"requirements"`
		Store []struct {
			Status   int    `json:"status"`
			Store5xx bool   `json:"store_5xx"`
			Expect   string `json:"expect"`
		} `json:"store"`
		StoredHeaders []struct {
			Name            string              `json:"name"`
			ResponseHeaders map[string][]string `json:"response_headers"`
			Allow           []string            `json:"allow"`
			Expect          map[string]string   `json:"expect"`
		} `json:"stored_headers"`
		Problems []struct {
			Code       string `json:"code"`
			Status     int    `json:"status"`
			Title      string `json:"title"`
			Retryable  bool   `json:"retryable"`
			Type       string `json:"type"`
			RetryAfter bool   `json:"retry_after"`
			Detail     string `json:"detail"`
		} `json:"problems"`
		Held []struct {
			Name string `json:"name"`
			Idem struct {
				Code              string   `json:"code"`
				RetryAfterSeconds *float64 `json:"retry_after_seconds"`
			} `json:"idem"`
			Expect struct {
				Status     int     `json:"status"`
				Code       string  `json:"code"`
				Retryable  bool    `json:"retryable"`
				RetryAfter *string `json:"retry_after"`
				Detail     string  `json:"detail"`
			} `json:"expect"`
		} `json:"held"`
		RequestIDs []struct {
			Header string `json:"header"`
			Kept   bool   `json:"kept"`
		} `json:"request_ids"`
		PreferWait []struct {
			Fields []string `json:"fields"`
			Expect int      `json:"expect"`
		} `json:"prefer_wait"`
		Attempts []struct {
			Name   string   `json:"name"`
			Fields []string `json:"fields"`
			Expect struct {
				Number  int     `json:"number"`
				Cause   *string `json:"cause"`
				Forward *string `json:"forward"`
			} `json:"expect"`
		} `json:"attempts"`
		Budget []struct {
			Name string `json:"name"`
			Idem struct {
				Code              string   `json:"code"`
				RetryAfterSeconds *float64 `json:"retry_after_seconds"`
				Spent             bool     `json:"spent"`
			} `json:"idem"`
			Expect struct {
				Status     int     `json:"status"`
				Code       string  `json:"code"`
				Retryable  bool    `json:"retryable"`
				RetryAfter *string `json:"retry_after"`
				Signal     bool    `json:"signal"`
				Detail     *string `json:"detail"`
			} `json:"expect"`
		} `json:"budget"`
	}
	load(t, "policy.json", &file)

	assert.Equal(t, file.DefaultStoredHeaders, frontdoor.DefaultStoredHeaders)
	require.NotEmpty(t, file.Requirements)
	for _, v := range file.Requirements {
		assert.Equal(t, v.Expect, frontdoor.Methods{}.For(v.Method).String(), v.Method)
	}
	require.NotEmpty(t, file.Store)
	for _, v := range file.Store {
		got := "release"
		switch {
		case !frontdoor.StorableStatus(v.Status):
			got = "not_replayable"
		case frontdoor.StoreStatus(v.Status, v.Store5xx):
			got = "store"
		}
		assert.Equal(t, v.Expect, got, "status %d store_5xx %v", v.Status, v.Store5xx)
	}
	require.NotEmpty(t, file.StoredHeaders)
	for _, v := range file.StoredHeaders {
		h := http.Header{}
		for k, vs := range v.ResponseHeaders {
			for _, x := range vs {
				h.Add(k, x)
			}
		}
		assert.Equal(t, v.Expect, frontdoor.StoredHeaders(h, v.Allow), v.Name)
	}
	require.Len(t, file.Problems, len(frontdoor.Problems))
	// The codes whose detail is fixed: the vectors hold it once, every
	// front door's constant must say the same.
	fixed := map[string]string{
		string(frontdoor.CodeResponseNotReplayable): frontdoor.NotReplayableDetail,
		string(frontdoor.CodeFingerprintMismatch):   frontdoor.MismatchDetail,
		string(frontdoor.CodeStorageQuotaExceeded):  frontdoor.StorageQuotaDetail,
		string(frontdoor.CodeTenantUnknown):         frontdoor.TenantUnknownDetail,
		string(frontdoor.CodeOutcomeReview):         frontdoor.OutcomeReviewDetail,
		string(frontdoor.CodeRetryBudgetExhausted):  frontdoor.RetryBudgetDetail,
	}
	for _, v := range file.Problems {
		assert.Equal(t, v.Detail, fixed[v.Code], "detail of %s", v.Code)
	}
	for _, v := range file.Problems {
		t.Run(v.Code, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/x", nil)
			r.Header.Set(frontdoor.HeaderRequestID, "req-1")
			w := httptest.NewRecorder()
			frontdoor.WriteProblem(w, r, &frontdoor.Error{Code: frontdoor.Code(v.Code), Detail: "d"})
			assert.Equal(t, v.Status, w.Code)
			assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
			assert.Equal(t, v.RetryAfter, w.Header().Get("Retry-After") == "1")
			var p map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			assert.Equal(t, map[string]any{
				"type": v.Type, "title": v.Title, "status": float64(v.Status), "detail": "d",
				"code": v.Code, "retryable": v.Retryable, "instance": "urn:idem:request:req-1",
			}, p)
		})
	}
	// Rule 8: idem's answers for a key its completer holds, through Held
	// (the gateway's and client/idemhttp's one mapping) and WriteProblem.
	require.NotEmpty(t, file.Held)
	for _, v := range file.Held {
		t.Run("held/"+v.Name, func(t *testing.T) {
			var ra time.Duration
			if v.Idem.RetryAfterSeconds != nil {
				ra = time.Duration(*v.Idem.RetryAfterSeconds * float64(time.Second))
			}
			e := frontdoor.Held(frontdoor.Code(v.Idem.Code), ra)
			require.NotNil(t, e)
			r := httptest.NewRequest(http.MethodPost, "/x", nil)
			w := httptest.NewRecorder()
			frontdoor.WriteProblem(w, r, e)
			assert.Equal(t, v.Expect.Status, w.Code)
			if v.Expect.RetryAfter == nil {
				assert.Empty(t, w.Header().Values("Retry-After"))
			} else {
				assert.Equal(t, *v.Expect.RetryAfter, w.Header().Get("Retry-After"))
			}
			var p frontdoor.Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			assert.Equal(t, v.Expect.Code, string(p.Code))
			assert.Equal(t, v.Expect.Retryable, p.Retryable)
			assert.Equal(t, v.Expect.Detail, p.Detail)
		})
	}
	assert.Nil(t, frontdoor.Held(frontdoor.CodeRequestInFlight, time.Second), "only the completer's codes")
	for _, v := range file.RequestIDs {
		assert.Equal(t, v.Kept, frontdoor.ValidRequestID(v.Header), "%q", v.Header)
	}
	require.NotEmpty(t, file.PreferWait)
	for _, v := range file.PreferWait {
		assert.Equal(t, v.Expect, frontdoor.PreferWait(v.Fields), "%q", v.Fields)
	}
	// Rule 9: the caller's Idem-Attempt, and what is passed on to idem.
	require.NotEmpty(t, file.Attempts)
	for _, v := range file.Attempts {
		a := frontdoor.CallerAttempt(v.Fields)
		assert.Equal(t, v.Expect.Number, a.Number, v.Name)
		cause := ""
		if v.Expect.Cause != nil {
			cause = *v.Expect.Cause
		}
		assert.Equal(t, cause, a.Cause, v.Name)
		if v.Expect.Forward == nil {
			assert.False(t, a.Retry(), v.Name)
		} else {
			assert.True(t, a.Retry(), v.Name)
			assert.Equal(t, *v.Expect.Forward, a.String(), v.Name)
		}
	}
	// Rule 9: the budget's refusal and signal, through BudgetRefusal and
	// SpentBudget (the gateway's and client/idemhttp's one mapping) and
	// WriteProblem.
	require.NotEmpty(t, file.Budget)
	for _, v := range file.Budget {
		t.Run("budget/"+v.Name, func(t *testing.T) {
			var ra time.Duration
			if v.Idem.RetryAfterSeconds != nil {
				ra = time.Duration(*v.Idem.RetryAfterSeconds * float64(time.Second))
			}
			e := frontdoor.SpentBudget(&frontdoor.Error{Code: frontdoor.Code(v.Idem.Code), RetryAfter: ra}, v.Idem.Spent)
			if v.Idem.Code == string(frontdoor.CodeRetryBudgetExhausted) {
				e = frontdoor.BudgetRefusal(ra)
			}
			w := httptest.NewRecorder()
			frontdoor.WriteProblem(w, httptest.NewRequest(http.MethodPost, "/x", nil), e)
			assert.Equal(t, v.Expect.Status, w.Code)
			if v.Expect.RetryAfter == nil {
				assert.Empty(t, w.Header().Values("Retry-After"))
			} else {
				assert.Equal(t, *v.Expect.RetryAfter, w.Header().Get("Retry-After"))
			}
			if v.Expect.Signal {
				assert.Equal(t, []string{"exhausted"}, w.Header().Values(frontdoor.HeaderRetryBudget))
			} else {
				assert.Empty(t, w.Header().Values(frontdoor.HeaderRetryBudget))
			}
			var p frontdoor.Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			assert.Equal(t, v.Expect.Code, string(p.Code))
			assert.Equal(t, v.Expect.Retryable, p.Retryable)
			if v.Expect.Detail != nil {
				assert.Equal(t, *v.Expect.Detail, p.Detail)
			}
		})
	}
}

// TestOperationVectors: Operation(method, Route(r)) of each request line of
// operations.json, read by net/http's own request parser with no route
// pattern, is the label the vector expects (the end-to-end tests send the
// same lines to idemhttp and the gateway over loopback).
func TestOperationVectors(t *testing.T) {
	var file struct {
		Vectors []struct {
			Name         string `json:"name"`
			Target       string `json:"target"`
			TargetBase64 string `json:"target_base64"`
			Expect       struct {
				Operation string `json:"operation"`
			} `json:"expect"`
		} `json:"vectors"`
	}
	load(t, "operations.json", &file)
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		target := v.Target
		if v.TargetBase64 != "" {
			raw, err := base64.StdEncoding.DecodeString(v.TargetBase64)
			require.NoError(t, err)
			target = string(raw)
		}
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader("POST " + target + " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")))
		require.NoError(t, err, v.Name)
		assert.Equal(t, v.Expect.Operation, frontdoor.Operation(r.Method, frontdoor.Route(r)), v.Name)
		assert.True(t, frontdoor.ValidLabelText(frontdoor.Operation(r.Method, frontdoor.Route(r))), v.Name)
	}
}
