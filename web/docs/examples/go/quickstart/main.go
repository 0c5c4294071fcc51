// Command quickstart runs the idem lifecycle with the Go SDK
// (github.com/idem-dev/idem/client): Do claims the key, runs the work,
// checkpoints, and completes; a second Do with the same key is a replay and
// does not run the work again.
//
//	IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> go run ./web/docs/examples/go/quickstart
//
// IDEM_KEY picks the key. It exits non-zero on failure.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/idem-dev/idem/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	base := os.Getenv("IDEM_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	c, err := client.New(base, client.WithToken(os.Getenv("IDEM_TOKEN")))
	if err != nil {
		return err
	}
	// One overall deadline; the SDK's retries and waits stay inside it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	key := os.Getenv("IDEM_KEY")
	if key == "" {
		// Event-derived: the same order always maps to the same key.
		key, err = client.Key("order-confirm", "4711", strconv.FormatInt(time.Now().Unix(), 10))
		if err != nil {
			return err
		}
	}
	req := client.Request{
		Operation: "POST /orders/4711/confirm",
		Payload:   map[string]any{"order_id": "4711", "amount": 1000, "currency": "usd"},
	}
	runs := 0
	work := func(ctx context.Context, claim *client.Claim) (client.Response, error) {
		runs++
		// Side effect 1 (e.g. charge the card), then record how far we got.
		if err := claim.Checkpoint(ctx, "charged", map[string]string{"charge_id": "ch_4711"}); err != nil {
			return client.Response{}, err
		}
		body, _ := json.Marshal(map[string]string{"order_id": "4711", "status": "confirmed"})
		return client.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}, nil
	}

	first, err := c.Do(ctx, key, req, work)
	if err != nil {
		return fmt.Errorf("first Do: %w", err)
	}
	fmt.Printf("ran %s: status=%d fencing_token=%d\n", key, first.Response.Status, first.FencingToken)

	again, err := c.Do(ctx, key, req, work)
	if err != nil {
		return fmt.Errorf("second Do: %w", err)
	}
	if !again.Replayed || runs != 1 || string(again.Response.Body) != string(first.Response.Body) {
		return fmt.Errorf("want a replay of the first response and one run, got replayed=%v runs=%d", again.Replayed, runs)
	}
	fmt.Printf("replayed %s: status=%d body=%s\n", key, again.Response.Status, again.Response.Body)
	return nil
}
