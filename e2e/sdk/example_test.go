package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/testkit/examplesrv"
)

// startExampleServer runs the real idem server wiring (SQLite in a
// temporary folder) behind an httptest server and returns its URL, a token
// for tenant "demo" and a stop function.
func startExampleServer() (url, token string, stop func()) {
	return examplesrv.Start("demo", "Demo", "example")
}

// Do runs the function once per key: the second call replays the stored
// response without running it.
func ExampleClient_Do() {
	url, token, stop := startExampleServer()
	defer stop()
	c, err := client.New(url, client.WithToken(token))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	orderID := "ord_42"
	key, _ := client.Key("order-confirm", orderID)
	charges := 0
	confirm := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
		if claim.RecoveryPoint() != "charged" { // a takeover resumes after the charge
			charges++ // call the payment provider here
			if err := claim.Checkpoint(ctx, "charged", map[string]string{"charge": "ch_1"}); err != nil {
				return client.Response{}, err
			}
		}
		return client.Response{Status: 201, Body: []byte(`{"order":"ord_42","status":"confirmed"}`)}, nil
	}
	req := client.Request{Operation: "POST /orders/confirm", Payload: map[string]string{"order": orderID}}
	for range 2 {
		res, err := c.Do(ctx, key, req, confirm)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Response.Status, string(res.Response.Body), "replayed:", res.Replayed)
	}
	fmt.Println("charges:", charges)

	// The same key with another request is refused.
	_, err = c.Do(ctx, key, client.Request{Operation: "POST /orders/confirm", Payload: map[string]string{"order": "ord_43"}}, confirm)
	fmt.Println(errors.Is(err, client.ErrFingerprintMismatch))
	// Output:
	// 201 {"order":"ord_42","status":"confirmed"} replayed: false
	// 201 {"order":"ord_42","status":"confirmed"} replayed: true
	// charges: 1
	// true
}

// A held key is a typed error with the service's Retry-After.
func ExampleClient_Claim() {
	url, token, stop := startExampleServer()
	defer stop()
	c, _ := client.New(url, client.WithToken(token))
	ctx := context.Background()

	first, err := c.Claim(ctx, "invoice-7", client.Request{Fingerprint: "v1", Lease: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("attempt", first.Attempt, "resumed", first.Resumed)

	_, err = c.Claim(ctx, "invoice-7", client.Request{Fingerprint: "v1"})
	var e *client.Error
	if errors.As(err, &e) && errors.Is(err, client.ErrRequestInFlight) {
		fmt.Println(e.Status, e.Code, "retry after ≤ 30s:", e.RetryAfter > 0 && e.RetryAfter <= 30*time.Second)
	}
	if _, err := c.Complete(ctx, "invoice-7", first.FencingToken, client.Response{Status: 200, Body: []byte("ok")}); err != nil {
		panic(err)
	}
	replay, _ := c.Claim(ctx, "invoice-7", client.Request{Fingerprint: "v1"})
	fmt.Println("replayed", replay.Replayed, string(replay.Response.Body))
	// Output:
	// attempt 1 resumed false
	// 409 request_in_flight retry after ≤ 30s: true
	// replayed true ok
}

// Keys come from the event, never from a random value per attempt.
func ExampleKey() {
	k, _ := client.Key("order-confirm", "ord_42")
	fmt.Println(k)
	k, _ = client.Key("refund", "user 7", "50%")
	fmt.Println(k)
	fmt.Println(client.ValidateKey("has space") != nil)
	// Output:
	// order-confirm:ord_42
	// refund:user%207:50%25
	// true
}

// The retry policy is on by default; WithRetryPolicy changes it.
func ExampleWithRetryPolicy() {
	c, _ := client.New("https://idem.example.com", client.WithRetryPolicy(client.RetryPolicy{
		MaxAttempts: 5,
		Jitter:      client.DecorrelatedJitter,
	}))
	p := c.RetryPolicy()
	fmt.Println(p.MaxAttempts, p.BaseDelay, p.MaxDelay, p.AttemptTimeout, p.BudgetCapacity, p.Retry500)
	fmt.Println(client.DefaultRetryPolicy().MaxAttempts)
	// Output:
	// 5 1s 30s 10s 10 false
	// 3
}
