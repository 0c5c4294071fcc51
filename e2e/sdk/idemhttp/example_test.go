package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
	"github.com/idem-dev/idem/testkit/examplesrv"
)

// Wrap a route of net/http's ServeMux so that a retried POST with the same Idempotency-Key
// gets the stored answer instead of creating a second order.
func ExampleMiddleware() {
	idemURL, token, stop := startIdem()
	defer stop()
	c, err := client.New(idemURL, client.WithToken(token))
	if err != nil {
		panic(err)
	}

	orders := 0
	// A chi router would pass its pattern: Options{Route: func(r *http.Request) string {
	// return chi.RouteContext(r.Context()).RoutePattern() }}.
	protect := idemhttp.Middleware(c, idemhttp.Options{})
	r := http.NewServeMux()
	r.Handle("POST /orders", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orders++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, orders)
	})))
	app := httptest.NewServer(r)
	defer app.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, app.URL+"/orders", strings.NewReader(`{"sku":"A"}`))
		req.Header.Set("Idempotency-Key", "checkout-1234")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	resp, _ := http.Post(app.URL+"/orders", "application/json", strings.NewReader(`{}`))
	resp.Body.Close()
	fmt.Println("without a key:", resp.StatusCode)
	// Output:
	// 201 {"order":1} replayed: false
	// 201 {"order":1} replayed: true
	// without a key: 400
}

// startIdem runs the real idem server wiring (SQLite) behind an httptest
// server, with a tenant "shop".
func startIdem() (url, token string, stop func()) {
	return examplesrv.Start("shop", "Shop", "shop-api")
}
