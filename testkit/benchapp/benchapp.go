// Package benchapp is the application of the app-level benchmark
// (`loadgen -mode app`, scripts/bench-app, docs/benchmarks.md "idem against
// an in-process library"): a small order API whose one route, POST
// /orders, does one INSERT into its own PostgreSQL table, served three
// ways so that what protection costs can be read against the same app:
//
//   - Unprotected: the handler alone, the floor every ratio divides by;
//   - Idem: the handler behind client/idemhttp with the SDK's defaults as a
//     new user gets them (client.New(url, client.WithToken(tok)),
//     idemhttp.Options{}), calling a real idem server;
//   - Library: the handler behind Library, a minimal in-process PostgreSQL
//     idempotency layer in the app's own database, doing what such a
//     library does (BEGIN, an advisory lock, SELECT … FOR UPDATE, an
//     upsert, COMMIT, before and after the handler: ~10 round trips).
//
// It is bench tooling, not a product: no authentication, one key space.
// `loadgen -serve-app VARIANT ADDR` serves it in a process of its own, so
// its CPU can be read from /proc.
package benchapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
)

// The three ways the app is served.
const (
	Unprotected = "unprotected"
	Idem        = "idem"
	Library     = "library"
)

// Variants lists them in the order the bench reports them.
var Variants = []string{Unprotected, Idem, Library}

// maxBody bounds the order body the handler reads.
const maxBody = 64 << 10

// schema is the app's own table, and the library's records table (created
// in every variant's database so the setup is one statement list; only
// Library writes it).
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id         bigserial PRIMARY KEY,
	amount     bigint NOT NULL,
	currency   text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
);
` + librarySchema

// Migrate creates the app's tables in the database (and schema) db points at.
func Migrate(ctx context.Context, db *pgxpool.Pool) error {
	if _, err := db.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create the app's tables: %w", err)
	}
	return nil
}

// order is the body of POST /orders and of its answer.
type order struct {
	ID       int64  `json:"id,omitzero"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Orders is the app's handler: POST /orders with {"amount", "currency"}
// inserts one row and answers 201 with it.
func Orders(db *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		var o order
		if err := json.Unmarshal(body, &o); err != nil || o.Amount <= 0 || len(o.Currency) != 3 {
			http.Error(w, "want {\"amount\": > 0, \"currency\": 3 letters}", http.StatusBadRequest)
			return
		}
		if err := db.QueryRow(r.Context(),
			`INSERT INTO orders (amount, currency) VALUES ($1, $2) RETURNING id`, o.Amount, o.Currency).Scan(&o.ID); err != nil {
			http.Error(w, "insert order: "+err.Error(), http.StatusInternalServerError)
			return
		}
		out, err := json.Marshal(o)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
}

// Config says how to serve the app.
type Config struct {
	// Variant is Unprotected, Idem or Library.
	Variant string
	// DB is the app's own database (its orders, and the library's records).
	DB *pgxpool.Pool
	// IdemURL and IdemToken reach the idem server (Idem only).
	IdemURL, IdemToken string
}

// New returns the app's routes for cfg.Variant.
func New(cfg Config) (http.Handler, error) {
	h := Orders(cfg.DB)
	switch cfg.Variant {
	case Unprotected:
	case Idem:
		if cfg.IdemURL == "" || cfg.IdemToken == "" {
			return nil, errors.New("variant idem needs the idem server's URL and a token")
		}
		// The SDK's defaults, as a new user gets them.
		c, err := client.New(cfg.IdemURL, client.WithToken(cfg.IdemToken))
		if err != nil {
			return nil, fmt.Errorf("idem client: %w", err)
		}
		h = idemhttp.Middleware(c, idemhttp.Options{})(h)
	case Library:
		h = (&Lib{DB: cfg.DB}).Wrap(h)
	default:
		return nil, fmt.Errorf("variant %q: want %s, %s or %s", cfg.Variant, Unprotected, Idem, Library)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", h)
	return mux, nil
}
