package benchapp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// librarySchema is Lib's records table: one row per key.
const librarySchema = `
CREATE TABLE IF NOT EXISTS idempotency_records (
	key          text PRIMARY KEY,
	fingerprint  bytea NOT NULL,
	state        text NOT NULL,
	locked_until timestamptz NOT NULL,
	status       integer,
	content_type text,
	body         bytea,
	created_at   timestamptz NOT NULL DEFAULT now(),
	updated_at   timestamptz NOT NULL DEFAULT now()
);
`

// The SQL of Lib, one statement per round trip, as such libraries send it.
const (
	libLock   = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	libSelect = `SELECT fingerprint, state, locked_until > now(), coalesce(status, 0), coalesce(content_type, ''), body
		FROM idempotency_records WHERE key = $1 FOR UPDATE`
	libStart = `INSERT INTO idempotency_records (key, fingerprint, state, locked_until)
		VALUES ($1, $2, 'in_progress', now() + make_interval(secs => $3))
		ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, state = 'in_progress',
			locked_until = excluded.locked_until, updated_at = now()`
	libFinish = `INSERT INTO idempotency_records (key, fingerprint, state, locked_until, status, content_type, body)
		VALUES ($1, $2, 'completed', now(), $3, $4, $5)
		ON CONFLICT (key) DO UPDATE SET state = 'completed', status = excluded.status,
			content_type = excluded.content_type, body = excluded.body, updated_at = now()`
)

// Lib is the bench's stand-in for an in-process PostgreSQL idempotency
// library (no outside library's code: none with a PostgreSQL store is
// among the Go modules this project may fetch). It does what such a
// library does around the handler, in the app's own database:
//
//	BEGIN; advisory lock on the key; SELECT … FOR UPDATE; upsert the key
//	in progress; COMMIT — the handler runs — BEGIN; advisory lock;
//	SELECT … FOR UPDATE; upsert the answer; COMMIT
//
// ten round trips for a fresh key; a replay is BEGIN, the lock, the
// SELECT, COMMIT. The same key with another request (method, path, body)
// is 422; a key in progress whose lock has not run out is 409; one whose
// lock ran out is taken over. It is a yardstick, not a product.
type Lib struct {
	DB *pgxpool.Pool
	// Lock is how long a key stays in progress before another request may
	// take it over (default 30 s, idem's default lease).
	Lock time.Duration
}

// Wrap returns next protected by the Idempotency-Key header.
func (l *Lib) Wrap(next http.Handler) http.Handler {
	lock := l.Lock
	if lock <= 0 {
		lock = 30 * time.Second
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		h := sha256.New()
		_, _ = io.WriteString(h, r.Method+" "+r.URL.Path+"\n")
		_, _ = h.Write(body)
		fp := h.Sum(nil)

		ctx := r.Context()
		replay, status, err := l.start(ctx, key, fp, lock)
		switch {
		case err != nil:
			http.Error(w, "idempotency: "+err.Error(), http.StatusServiceUnavailable)
			return
		case replay != nil:
			w.Header().Set("Content-Type", replay.contentType)
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(replay.status)
			_, _ = w.Write(replay.body)
			return
		case status != 0:
			http.Error(w, http.StatusText(status), status)
			return
		}

		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(rec, r)
		if err := l.finish(ctx, key, fp, rec); err != nil {
			// The handler ran: its answer goes out; the key stays in
			// progress until its lock runs out.
			w.Header().Set("Idempotency-Error", "store the answer: "+err.Error())
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// stored is a completed key's answer.
type stored struct {
	status      int
	contentType string
	body        []byte
}

// errNotFound marks a key without a record.
var errNotFound = errors.New("no record")

// start is the first transaction: it returns the stored answer of a
// completed key, a refusal status (409, 422), or neither when the handler
// is to run.
func (l *Lib) start(ctx context.Context, key string, fp []byte, lock time.Duration) (*stored, int, error) {
	tx, err := l.DB.Begin(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, libLock, key); err != nil {
		return nil, 0, err
	}
	var (
		oldFP  []byte
		state  string
		locked bool
		s      stored
	)
	err = tx.QueryRow(ctx, libSelect, key).Scan(&oldFP, &state, &locked, &s.status, &s.contentType, &s.body)
	if errors.Is(err, pgx.ErrNoRows) {
		err = errNotFound
	}
	switch {
	case err == nil && !bytes.Equal(oldFP, fp):
		return nil, http.StatusUnprocessableEntity, nil
	case err == nil && state == "completed":
		return &s, 0, tx.Commit(ctx)
	case err == nil && locked:
		return nil, http.StatusConflict, nil
	case err != nil && !errors.Is(err, errNotFound):
		return nil, 0, err
	}
	if _, err := tx.Exec(ctx, libStart, key, fp, lock.Seconds()); err != nil {
		return nil, 0, err
	}
	return nil, 0, tx.Commit(ctx)
}

// finish is the second transaction: it stores the handler's answer.
func (l *Lib) finish(ctx context.Context, key string, fp []byte, rec *recorder) error {
	tx, err := l.DB.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, libLock, key); err != nil {
		return err
	}
	var (
		oldFP  []byte
		state  string
		locked bool
		s      stored
	)
	if err := tx.QueryRow(ctx, libSelect, key).Scan(&oldFP, &state, &locked, &s.status, &s.contentType, &s.body); err != nil {
		return err
	}
	if state != "in_progress" || !bytes.Equal(oldFP, fp) {
		return errors.New("the key was taken over while the handler ran (state " + state + ")")
	}
	if _, err := tx.Exec(ctx, libFinish, key, fp, rec.status, rec.header.Get("Content-Type"), rec.body.Bytes()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// recorder buffers the handler's answer so it can be stored before it is
// sent.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(status int) {
	if !rec.wrote {
		rec.status, rec.wrote = status, true
	}
}

func (rec *recorder) Write(b []byte) (int, error) {
	rec.WriteHeader(http.StatusOK)
	return rec.body.Write(b)
}
