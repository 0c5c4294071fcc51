package client

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The shared SDK vectors (testvectors/sdk) pin the behaviour every idem SDK
// must show; the Python and Node SDKs run the same files. These tests run
// every vector against this SDK.

// vectorsDir is testvectors/sdk at the root of the repository.
var vectorsDir = filepath.Join("..", "testvectors", "sdk")

func loadVectors(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir, name))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v), name)
}

func TestVectorsKeys(t *testing.T) {
	t.Parallel()
	var v struct {
		Validate []struct {
			Name  string `json:"name"`
			Key   string `json:"key"`
			Valid bool   `json:"valid"`
			Error Code   `json:"error"`
		} `json:"validate"`
		Derive []struct {
			Name  string   `json:"name"`
			Parts []string `json:"parts"`
			Key   string   `json:"key"`
			Error Code     `json:"error"`
		} `json:"derive"`
	}
	loadVectors(t, "keys.json", &v)
	require.NotEmpty(t, v.Validate)
	require.NotEmpty(t, v.Derive)
	for _, tc := range v.Validate {
		err := ValidateKey(tc.Key)
		if tc.Valid {
			require.NoError(t, err, tc.Name)
		} else {
			require.Equal(t, tc.Error, ErrorCode(err), tc.Name)
		}
	}
	for _, tc := range v.Derive {
		key, err := Key(tc.Parts...)
		if tc.Error != "" {
			require.Equal(t, tc.Error, ErrorCode(err), tc.Name)
			continue
		}
		require.NoError(t, err, tc.Name)
		require.Equal(t, tc.Key, key, tc.Name)
		require.NoError(t, ValidateKey(key), tc.Name)
	}
}

func TestVectorsRetryAfter(t *testing.T) {
	t.Parallel()
	var v struct {
		Now   time.Time `json:"now"`
		Cases []struct {
			Name    string `json:"name"`
			Header  string `json:"header"`
			Seconds int64  `json:"seconds"`
		} `json:"cases"`
	}
	loadVectors(t, "retry_after.json", &v)
	require.NotEmpty(t, v.Cases)
	for _, tc := range v.Cases {
		require.Equal(t, time.Duration(tc.Seconds)*time.Second, parseRetryAfter(tc.Header, v.Now), tc.Name)
	}
}

func TestVectorsBackoff(t *testing.T) {
	t.Parallel()
	var v struct {
		Base       float64 `json:"base_seconds"`
		Cap        float64 `json:"cap_seconds"`
		Attempts   int     `json:"max_attempts"`
		Spread     float64 `json:"retry_after_spread_seconds"`
		MinAttempt float64 `json:"min_attempt_seconds"`
		FullJitter []struct {
			Retry   int     `json:"retry"`
			Random  float64 `json:"random"`
			Ceiling float64 `json:"ceiling_seconds"`
			Wait    float64 `json:"wait_seconds"`
		} `json:"full_jitter"`
		RetryAfter []struct {
			RetryAfter float64 `json:"retry_after_seconds"`
			Random     float64 `json:"random"`
			Wait       float64 `json:"wait_seconds"`
		} `json:"retry_after"`
		Fits []struct {
			Name   string `json:"name"`
			LeftMS *int64 `json:"left_ms"`
			WaitMS int64  `json:"wait_ms"`
			Fits   bool   `json:"fits"`
		} `json:"fits"`
	}
	loadVectors(t, "backoff.json", &v)
	p := DefaultRetryPolicy()
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	require.Equal(t, seconds(v.Base), p.BaseDelay)
	require.Equal(t, seconds(v.Cap), p.MaxDelay)
	require.Equal(t, v.Attempts, p.MaxAttempts)
	require.Equal(t, seconds(v.Spread), p.RetryAfterJitter)
	require.Equal(t, seconds(v.MinAttempt), p.MinAttemptTime)

	require.NotEmpty(t, v.FullJitter)
	for _, tc := range v.FullJitter {
		ceiling := p.fullJitterCeiling(tc.Retry)
		require.Equal(t, seconds(tc.Ceiling), ceiling, "retry %d", tc.Retry)
		require.InDelta(t, tc.Wait, tc.Random*ceiling.Seconds(), 1e-6, "retry %d random %v", tc.Retry, tc.Random)
		// The SDK draws the random value itself: its waits stay in [0, ceiling).
		for range 200 {
			d := p.backoff(tc.Retry, 0)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling)
		}
	}
	require.NotEmpty(t, v.RetryAfter)
	for _, tc := range v.RetryAfter {
		ra := seconds(tc.RetryAfter)
		require.InDelta(t, tc.Wait, tc.RetryAfter+tc.Random*p.RetryAfterJitter.Seconds(), 1e-6)
		for range 200 {
			d := p.retryAfterWait(ra)
			require.GreaterOrEqual(t, d, ra)
			require.Less(t, d, ra+p.RetryAfterJitter)
		}
	}
	require.NotEmpty(t, v.Fits)
	for _, tc := range v.Fits {
		clock := &vectorClock{now: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)}
		c, err := New("http://127.0.0.1:1", WithClock(clock))
		require.NoError(t, err)
		ctx := context.Background()
		if tc.LeftMS != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, clock.now.Add(time.Duration(*tc.LeftMS)*time.Millisecond))
			defer cancel()
		}
		require.Equal(t, tc.Fits, c.fits(ctx, time.Duration(tc.WaitMS)*time.Millisecond), tc.Name)
	}
}

func TestVectorsBudget(t *testing.T) {
	t.Parallel()
	var v struct {
		Capacity float64 `json:"capacity"`
		Cost     float64 `json:"retry_cost"`
		Refund   float64 `json:"success_refund"`
		Steps    []struct {
			Op     string  `json:"op"`
			OK     bool    `json:"ok"`
			Repeat int     `json:"repeat"`
			Left   float64 `json:"left"`
		} `json:"steps"`
	}
	loadVectors(t, "budget.json", &v)
	p := DefaultRetryPolicy()
	require.Equal(t, v.Capacity, p.BudgetCapacity)
	require.Equal(t, v.Cost, p.BudgetRetryCost)
	require.Equal(t, v.Refund, p.BudgetSuccessRefund)
	b := newRetryBudget(p)
	require.NotEmpty(t, v.Steps)
	for i, s := range v.Steps {
		switch s.Op {
		case "take":
			require.Equal(t, s.OK, b.take(), "step %d", i)
		case "success":
			for range s.Repeat {
				b.success()
			}
		default:
			t.Fatalf("step %d: unknown op %q", i, s.Op)
		}
		require.InDelta(t, s.Left, b.left(), 1e-6, "step %d", i)
	}
}

func TestVectorsReplay(t *testing.T) {
	t.Parallel()
	var v struct {
		Decode []struct {
			Name     string            `json:"name"`
			Response json.RawMessage   `json:"response"`
			Status   int               `json:"status"`
			Headers  map[string]string `json:"headers"`
			BodyHex  string            `json:"body_hex"`
			Error    bool              `json:"error"`
		} `json:"decode"`
		Encode []struct {
			Name         string `json:"name"`
			BodyHex      string `json:"body_hex"`
			Body         string `json:"body"`
			BodyEncoding string `json:"body_encoding"`
		} `json:"encode"`
		ClaimAnswers []struct {
			Name    string            `json:"name"`
			Status  int               `json:"status"`
			Headers map[string]string `json:"headers"`
			Body    string            `json:"body"`
			Expect  string            `json:"expect"`
		} `json:"claim_answers"`
	}
	loadVectors(t, "replay.json", &v)
	require.NotEmpty(t, v.Decode)
	for _, tc := range v.Decode {
		var r Response
		err := json.Unmarshal(tc.Response, &r)
		if tc.Error {
			require.Error(t, err, tc.Name)
			continue
		}
		require.NoError(t, err, tc.Name)
		require.Equal(t, tc.Status, r.Status, tc.Name)
		require.Equal(t, len(tc.Headers), len(r.Headers), tc.Name)
		for k, val := range tc.Headers {
			require.Equal(t, val, r.Headers[k], tc.Name)
		}
		require.Equal(t, tc.BodyHex, hex.EncodeToString(r.Body), tc.Name)
	}
	require.NotEmpty(t, v.Encode)
	for _, tc := range v.Encode {
		body, err := hex.DecodeString(tc.BodyHex)
		require.NoError(t, err)
		b, err := json.Marshal(Response{Status: 200, Body: body})
		require.NoError(t, err)
		var w wireResponse
		require.NoError(t, json.Unmarshal(b, &w))
		require.Equal(t, tc.Body, w.Body, tc.Name)
		require.Equal(t, tc.BodyEncoding, w.BodyEncoding, tc.Name)
	}
	require.NotEmpty(t, v.ClaimAnswers)
	for _, tc := range v.ClaimAnswers {
		// The server answers every claim so; complete and release succeed,
		// so that only the claim's answer decides.
		var claims, writes atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/claim") {
				writes.Add(1)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"key":"k","state":"completed","fencing_token":3,"attempt":1}`)
				return
			}
			claims.Add(1)
			for k, val := range tc.Headers {
				w.Header().Set(k, val)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.Status)
			_, _ = io.WriteString(w, tc.Body)
		}))
		c, err := New(srv.URL, WithRetryPolicy(RetryPolicy{BaseDelay: time.Millisecond}))
		require.NoError(t, err)
		cr, err := c.Claim(context.Background(), "k", Request{Operation: "op", Payload: map[string]any{}})
		ran := false
		res, derr := c.Do(context.Background(), "k", Request{Operation: "op", Payload: map[string]any{}}, func(context.Context, *Claim) (Response, error) {
			ran = true
			return Response{Status: 201, Body: []byte("ran")}, nil
		})
		srv.Close()
		switch tc.Expect {
		case "invalid":
			require.ErrorIs(t, err, ErrInvalidAnswer, tc.Name)
			require.ErrorIs(t, derr, ErrInvalidAnswer, tc.Name)
			require.False(t, ran, "%s: the function must not run on an answer the client cannot interpret", tc.Name)
			require.Zero(t, writes.Load(), "%s: nothing is completed or released", tc.Name)
			require.Equal(t, int64(2), claims.Load(), "%s: not retried", tc.Name)
		case "claim":
			require.NoError(t, err, tc.Name)
			require.False(t, cr.Replayed, tc.Name)
			require.NoError(t, derr, tc.Name)
			require.True(t, ran, tc.Name)
		case "replay":
			require.NoError(t, err, tc.Name)
			require.True(t, cr.Replayed, tc.Name)
			require.NoError(t, derr, tc.Name)
			require.False(t, ran, tc.Name)
			require.True(t, res.Replayed, tc.Name)
			require.Equal(t, "x", string(res.Response.Body), tc.Name)
		default:
			t.Fatalf("%s: unknown expect %q", tc.Name, tc.Expect)
		}
	}
}

// TestVectorsClassification sends a claim through Do against a server that
// fails the first claim as the vector says and accepts the second: a
// retried failure makes two claims, a final one a single claim. With
// Request.NoWait, only the in-flight wait is switched off, which tells the
// two retry mechanisms apart.
func TestVectorsClassification(t *testing.T) {
	t.Parallel()
	var v struct {
		Cases []struct {
			Name      string `json:"name"`
			Status    int    `json:"status"`
			Code      Code   `json:"code"`
			Transport string `json:"transport"`
			Policy    struct {
				Retry500 bool `json:"retry_500"`
			} `json:"policy"`
			Retry bool   `json:"retry"`
			How   string `json:"how"`
		} `json:"cases"`
	}
	loadVectors(t, "classification.json", &v)
	require.NotEmpty(t, v.Cases)
	for _, tc := range v.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			for _, noWait := range []bool{false, true} {
				var claims atomic.Int64
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if strings.HasSuffix(r.URL.Path, "/complete") {
						w.Header().Set("Content-Type", "application/json")
						_, _ = io.WriteString(w, `{"key":"k","state":"completed","fencing_token":1,"attempt":1}`)
						return
					}
					if claims.Add(1) == 1 && tc.Transport == "" {
						w.Header().Set("Retry-After", "1")
						if tc.Code == CodeUnknown {
							w.Header().Set("Content-Type", "text/plain")
							w.WriteHeader(tc.Status)
							_, _ = io.WriteString(w, "not a problem document")
							return
						}
						w.Header().Set("Content-Type", "application/problem+json")
						w.WriteHeader(tc.Status)
						_ = json.NewEncoder(w).Encode(map[string]any{"type": "urn:idem:problem:" + tc.Code, "title": "x", "status": tc.Status, "code": tc.Code})
						return
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, `{"key":"k","state":"in_flight","fencing_token":1,"attempt":1}`)
				}))
				defer srv.Close()

				opts := []Option{WithClock(&vectorClock{now: time.Now()}), WithRetryPolicy(RetryPolicy{Retry500: tc.Policy.Retry500})}
				var failed atomic.Bool
				failFirst := func() bool { return failed.CompareAndSwap(false, true) }
				switch tc.Transport {
				case "":
				case "token_error":
					opts = append(opts, WithTokenSource(func(context.Context) (string, error) {
						if failFirst() {
							claims.Add(1)
							return "", errors.New("token source down")
						}
						return "t", nil
					}))
				default:
					terr := transportError(t, tc.Transport)
					opts = append(opts, WithHTTPClient(&http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
						if strings.HasSuffix(r.URL.Path, "/claim") && failFirst() {
							claims.Add(1)
							return nil, terr
						}
						return http.DefaultTransport.RoundTrip(r)
					})}))
				}
				c, err := New(srv.URL, opts...)
				require.NoError(t, err)
				_, err = c.Do(context.Background(), "k", Request{Operation: "op", Payload: map[string]any{}, Lease: 30 * time.Second, NoWait: noWait},
					func(context.Context, *Claim) (Response, error) { return Response{Status: 201}, nil })
				retried := tc.Retry && !(noWait && tc.How == "in_flight")
				if retried {
					require.NoError(t, err, "noWait=%v", noWait)
					require.Equal(t, int64(2), claims.Load(), "noWait=%v", noWait)
				} else {
					require.Error(t, err, "noWait=%v", noWait)
					require.Equal(t, int64(1), claims.Load(), "noWait=%v: %v", noWait, err)
					if tc.Transport == "" {
						require.Equal(t, tc.Code, ErrorCode(err))
					}
				}
			}
		})
	}
}

// transportError returns the error a transport gives for a named failure.
func transportError(t *testing.T, name string) error {
	t.Helper()
	switch name {
	case "connection_refused":
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case "connection_reset":
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	case "eof":
		return io.EOF
	case "timeout":
		return &net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}
	}
	t.Fatalf("unknown transport failure %q", name)
	return nil
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// vectorClock is a Clock whose Sleep returns at once and advances Now.
type vectorClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *vectorClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *vectorClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}
