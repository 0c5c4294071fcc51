package api

import (
	"context"
	"net/http"
	"time"

	"github.com/idem-dev/idem/retrybudget"
)

// GET /v1/admin/retry-amplification: the last hour of the retry budget of
// this replica, per tenant and per minute, for the dashboard's "Retry
// amplification" section. It reads the budget's memory only, never the
// store, so it answers during a store outage, when it matters most.

// amplificationRequest is GET /v1/admin/retry-amplification?tenant=.
type amplificationRequest struct {
	tenant string `json:"-"` // from the query, never the body
}

func (a *amplificationRequest) bind(r *http.Request) (err error) {
	a.tenant, err = bindTenantFilter(r.URL.Query())
	return err
}

type amplificationJSON struct {
	WindowSeconds float64                   `json:"window_seconds"`
	BucketSeconds int64                     `json:"bucket_seconds"`
	Tenants       []tenantAmplificationJSON `json:"tenants"`
}

type tenantAmplificationJSON struct {
	Tenant        string                    `json:"tenant"`
	Amplification float64                   `json:"amplification"`
	Window        attemptCountsJSON         `json:"window"`
	Buckets       []amplificationBucketJSON `json:"buckets"`
}

type attemptCountsJSON struct {
	FirstAttempts int64 `json:"first_attempts"`
	Retries       int64 `json:"retries"`
	Refused       int64 `json:"refused"`
}

type amplificationBucketJSON struct {
	Start time.Time `json:"start"`
	attemptCountsJSON
	Amplification float64 `json:"amplification"`
}

func (s *service) retryAmplification(_ context.Context, req *amplificationRequest) (amplificationJSON, error) {
	var hs []retrybudget.History
	if req.tenant != "" {
		hs = []retrybudget.History{s.retries.History(req.tenant)}
	} else {
		hs = s.retries.Histories()
	}
	out := amplificationJSON{
		WindowSeconds: s.retries.Window().Seconds(),
		BucketSeconds: int64(retrybudget.HistoryBucket / time.Second),
		Tenants:       make([]tenantAmplificationJSON, 0, len(hs)),
	}
	for _, h := range hs {
		t := tenantAmplificationJSON{
			Tenant:        h.Window.Tenant,
			Amplification: h.Window.Amplification(),
			Window:        attemptCountsJSON{h.Window.First, h.Window.Retries, h.Window.Refused},
			Buckets:       make([]amplificationBucketJSON, len(h.Buckets)),
		}
		for i, b := range h.Buckets {
			t.Buckets[i] = amplificationBucketJSON{Start: b.Start, attemptCountsJSON: attemptCountsJSON{b.First, b.Retries, b.Refused}, Amplification: b.Amplification()}
		}
		out.Tenants = append(out.Tenants, t)
	}
	return out, nil
}
