// Command benchfloor is the floor the idem server is measured against by
// scripts/bench: a bare net/http + pgx server that runs the store's own
// ClaimKey and CompleteKey statements (the sqlc-generated code of package
// postgres, so the SQL and the scan are the server's) on the same schema and
// answers with the same JSON shapes, and does nothing else: no
// authentication, no validation, no rate limit, no access log, no metrics,
// no JCS (the fingerprint is the SHA-256 of the request bytes as sent).
// Whatever idem spends per request beyond this program is what its checks,
// logs and glue cost.
//
// It lives under postgres/internal because it calls the store's generated
// queries; it is bench tooling, not a product: every key belongs to the
// tenant "bench", which must exist (scripts/bench creates it with
// `idem tenant create bench`, which also applies the migrations).
//
//	IDEM_DATABASE_URL=postgres://… benchfloor -addr 127.0.0.1:0 [-pool 10]
//
// It prints `{"msg":"listening","addr":"…"}` on stderr (the line
// scripts/bench waits for) and serves until SIGINT/SIGTERM. The address must
// be loopback.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// The tenant and its settings: the defaults `idem tenant create` gives.
const (
	tenant          = "bench"
	lease           = 30 * time.Second
	replayWindow    = 86400
	reaperThreshold = 259200
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback only)")
	pool := flag.Int("pool", 10, "connection pool size (the server's default is 10)")
	flag.Parse()
	if err := run(*addr, int32(*pool)); err != nil {
		fmt.Fprintf(os.Stderr, "benchfloor: %v\n", err)
		os.Exit(1)
	}
}

func run(addr string, poolSize int32) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: must be a loopback host:port", addr)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("IDEM_DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("IDEM_DATABASE_URL: %w", err)
	}
	cfg.MaxConns = poolSize
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	f := &floor{q: dbsqlc.New(db)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/keys/{key}/claim", f.claim)
	mux.HandleFunc("POST /v1/keys/{key}/complete", f.complete)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Fprintf(os.Stderr, "{\"msg\":\"listening\",\"addr\":\"%s\"}\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type floor struct{ q *dbsqlc.Queries }

func timeJSON(t pgtype.Timestamptz) *string {
	if !t.Valid {
		return nil
	}
	s := t.Time.UTC().Format(time.RFC3339Nano)
	return &s
}

func fail(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "detail": err.Error()})
}

// failed answers a statement's error, if any: 409 when it applied nothing
// (no row), 500 otherwise. It reports whether it answered.
func failed(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, pgx.ErrNoRows):
		fail(w, http.StatusConflict, err)
	default:
		fail(w, http.StatusInternalServerError, err)
	}
	return true
}

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// claim answers 201 with the shape of idem's claim, or 409 when the
// statement applied nothing (idem would tell why; the floor does not).
func (f *floor) claim(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Operation string          `json:"operation"`
		Request   json.RawMessage `json:"request"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	sum := sha256.Sum256(in.Request)
	row, err := f.q.ClaimKey(r.Context(), dbsqlc.ClaimKeyParams{
		TenantID:               tenant,
		Key:                    r.PathValue("key"),
		Operation:              in.Operation,
		Fingerprint:            "sha256:" + hex.EncodeToString(sum[:]),
		LeaseUs:                lease.Microseconds(),
		ReplayWindowSeconds:    replayWindow,
		ReaperThresholdSeconds: reaperThreshold,
	})
	if failed(w, err) {
		return
	}
	k := row
	reply(w, http.StatusCreated, struct {
		Key            string          `json:"key"`
		State          string          `json:"state"`
		FencingToken   int64           `json:"fencing_token"`
		Attempt        int32           `json:"attempt"`
		Resumed        bool            `json:"resumed"`
		LeaseExpiresAt *string         `json:"lease_expires_at"`
		RecoveryPoint  *string         `json:"recovery_point"`
		RecoveryData   json.RawMessage `json:"recovery_data"`
	}{k.Key, k.State, k.FencingToken, k.Attempt, k.Attempt > 1, timeJSON(k.LeaseExpiresAt), k.RecoveryPoint, nullJSON(k.RecoveryData)})
}

func nullJSON(b []byte) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// complete answers 200 with the shape of idem's record, or 409 when the
// token is not current.
func (f *floor) complete(w http.ResponseWriter, r *http.Request) {
	var in struct {
		FencingToken int64 `json:"fencing_token"`
		Response     struct {
			Status  int32             `json:"status"`
			Headers map[string]string `json:"headers"`
			Body    string            `json:"body"`
		} `json:"response"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	headers, err := json.Marshal(in.Response.Headers)
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	row, err := f.q.CompleteKey(r.Context(), dbsqlc.CompleteKeyParams{
		ResponseStatus:       in.Response.Status,
		ResponseHeaders:      headers,
		ResponseBody:         []byte(in.Response.Body),
		ResponseBodyEncoding: "utf8",
		TenantID:             tenant,
		Key:                  r.PathValue("key"),
		FencingToken:         in.FencingToken,
	})
	if failed(w, err) {
		return
	}
	k := row
	type response struct {
		Status       int32             `json:"status"`
		Headers      map[string]string `json:"headers"`
		Body         string            `json:"body"`
		BodyEncoding string            `json:"body_encoding"`
	}
	reply(w, http.StatusOK, struct {
		Key            string          `json:"key"`
		State          string          `json:"state"`
		Operation      string          `json:"operation"`
		Fingerprint    string          `json:"fingerprint"`
		FencingToken   int64           `json:"fencing_token"`
		Attempt        int32           `json:"attempt"`
		LeaseExpiresAt *string         `json:"lease_expires_at"`
		RecoveryPoint  *string         `json:"recovery_point"`
		RecoveryData   json.RawMessage `json:"recovery_data"`
		CreatedAt      *string         `json:"created_at"`
		CompletedAt    *string         `json:"completed_at"`
		ReplayUntil    *string         `json:"replay_until"`
		PurgeAfter     *string         `json:"purge_after"`
		Response       response        `json:"response"`
	}{
		// CompleteKey returns what the caller does not know (completedRow)
		r.PathValue("key"), "completed", k.Operation, k.Fingerprint, in.FencingToken, k.Attempt, nil, k.RecoveryPoint, nullJSON(k.RecoveryData),
		timeJSON(k.CreatedAt), timeJSON(k.ObservedAt), timeJSON(k.ReplayUntil), timeJSON(k.PurgeAfter),
		response{in.Response.Status, in.Response.Headers, in.Response.Body, "utf8"},
	})
}
