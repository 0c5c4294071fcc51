// Command resume is a resume endpoint for idem's completer, written with
// the Go SDK (github.com/idem-dev/idem/client): when a worker dies holding
// a key, idem takes the key over and POSTs here; ResumeHandler checks the
// signature and runs confirmOrder — the very function the original Do ran
// — from the dead attempt's recovery point, and answers its outcome.
//
//	IDEM_URL=http://127.0.0.1:8080 IDEM_TOKEN=<jwt with keys:write> \
//	IDEM_COMPLETER_SECRET=whsec_... IDEM_LISTEN=127.0.0.1:8090 go run ./web/docs/examples/go/resume
//
// Register it once with POST /v1/completers {"url": "https://<host>/idem/resume"}
// (the answer holds IDEM_COMPLETER_SECRET). It prints "charged <key>" for
// each charge it makes, so you can see a resumed order is never charged twice.
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/idem-dev/idem/client"
)

// confirmOrder is the work of POST /orders/{id}/confirm, run by Do in the
// request handler and by the resume endpoint alike: charge once, record
// it, answer. After a takeover RecoveryPoint says how far the dead attempt got.
func confirmOrder(ctx context.Context, claim *client.Claim) (client.Response, error) {
	if claim.RecoveryPoint() != "charged" {
		fmt.Println("charged", claim.Key()) // the external call (charge the card)
		if err := claim.Checkpoint(ctx, "charged", map[string]string{"charge_id": "ch_" + claim.Key()}); err != nil {
			return client.Response{}, err
		}
	}
	return client.Response{
		Status:  201,
		Headers: map[string]string{"Content-Type": "application/json"},
		Body:    []byte(`{"order":"` + claim.Key() + `","status":"confirmed"}`),
	}, nil
}

func main() {
	c, err := client.New(os.Getenv("IDEM_URL"), client.WithToken(os.Getenv("IDEM_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /idem/resume", c.ResumeHandler(os.Getenv("IDEM_COMPLETER_SECRET"),
		func(ctx context.Context, call client.ResumeCall, claim *client.Claim) (client.Response, error) {
			switch call.Operation {
			case "POST /orders/confirm":
				return confirmOrder(ctx, claim)
			}
			// Not ours to judge: a person looks at it.
			return client.Response{}, client.NeedsReview("no resume code for " + call.Operation)
		}))
	addr := os.Getenv("IDEM_LISTEN")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening", ln.Addr())
	log.Fatal(http.Serve(ln, mux))
}
