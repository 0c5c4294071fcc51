package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keyevents"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

// eventsChannel is the NOTIFY channel a key flagged waited (Watch) is
// announced on when it is completed (CompleteKey and ResolveCompleteKey,
// through idem_notify_key of migration 00010) or deleted (the trigger of
// migration 00008).
const eventsChannel = "idem_keys"

// listenTimeout bounds how long Subscribe waits for the listening
// connection; past it the claim answers without waiting.
const listenTimeout = 2 * time.Second

// listener is the store's one listening connection: it LISTENs on
// eventsChannel, keeps the notifications of its own schema and fans them
// out in process to the subscriptions of every waiting claim. It starts
// with the first Subscribe and reconnects with backoff until the store
// closes; after every reconnection it wakes all subscriptions, since
// notifications sent while it was down are lost.
type listener struct {
	cfg    *pgx.ConnConfig
	events keyevents.Broadcast

	once    sync.Once
	started atomic.Bool
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}

	mu    sync.Mutex
	ready chan struct{} // closed while listening; replaced when the connection is lost
	// connected is set once the first connection listened (used by run's
	// goroutine only).
	connected bool
	// visibility of the connection's losses (listenlog.go).
	watch listenWatch
}

func newListener(cfg *pgx.ConnConfig) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{cfg: cfg, ctx: ctx, cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
}

// Subscribe implements idem.KeyEvents: the subscription is live once the
// store's listening connection is, so a change committed after Subscribe
// returns reaches it, from this replica or any other on the same schema.
func (s *Store) Subscribe(ctx context.Context, tenantID, key string) (*idem.Subscription, error) {
	l := s.listener
	if s.closed.Load() {
		return nil, idem.StoreUnavailable("the store is closed", nil)
	}
	sub := l.events.Subscribe(tenantID, key)
	l.once.Do(func() {
		l.started.Store(true)
		go l.run()
	})
	l.mu.Lock()
	ready := l.ready
	l.mu.Unlock()
	timer := time.NewTimer(listenTimeout)
	defer timer.Stop()
	select {
	case <-ready:
		return sub, nil
	case <-ctx.Done():
		sub.Close()
		return nil, ctx.Err()
	case <-timer.C:
	case <-l.ctx.Done():
	}
	sub.Close()
	return nil, idem.StoreUnavailable("the store's listening connection is not up", nil)
}

// Watch implements idem.KeyEvents: it flags the key's row waited, so its
// completion or deletion notifies (a complete or delete of a
// row nobody waits on notifies nothing: NOTIFY serialises commits). The
// flag write and the complete or delete both lock the row, so either the
// flag is set first and the change notifies, or Watch finds the key no
// longer in flight and reports false. A row already flagged is only read:
// nothing resets the flag, so a thousand waiters write the row once.
func (s *Store) Watch(ctx context.Context, tenantID, key string) (bool, error) {
	row, err := s.q.KeyWaited(ctx, dbsqlc.KeyWaitedParams{TenantID: tenantID, Key: key})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.interpretError(err, "watch key")
	}
	if !row.InFlight || row.Waited {
		return row.InFlight, nil
	}
	n, err := s.q.MarkKeyWaited(ctx, dbsqlc.MarkKeyWaitedParams{TenantID: tenantID, Key: key})
	if err != nil {
		return false, s.interpretError(err, "watch key")
	}
	return n > 0, nil
}

// run keeps a listening connection until the store closes.
func (l *listener) run() {
	defer close(l.done)
	backoff := 100 * time.Millisecond
	for l.ctx.Err() == nil {
		if err := l.listen(); err != nil && l.ctx.Err() == nil {
			l.watch.failed(err)
			select {
			case <-time.After(backoff):
			case <-l.ctx.Done():
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// listen connects, LISTENs, reports ready and publishes notifications until
// the connection fails or the store closes.
func (l *listener) listen() error {
	conn, err := pgx.ConnectConfig(l.ctx, l.cfg)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	var schema string
	if err := conn.QueryRow(l.ctx, "SELECT coalesce(current_schema(), '')").Scan(&schema); err != nil {
		return err
	}
	if _, err := conn.Exec(l.ctx, "LISTEN "+eventsChannel); err != nil {
		return err
	}
	if l.connected {
		// Whatever changed while no connection listened was not heard:
		// every live subscription claims again.
		l.events.PublishAll()
	}
	l.watch.listening()
	l.connected = true
	l.mu.Lock()
	close(l.ready)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.ready = make(chan struct{})
		l.mu.Unlock()
	}()
	prefix := schema + "\n"
	for {
		n, err := conn.WaitForNotification(l.ctx)
		if err != nil {
			return err
		}
		rest, ok := strings.CutPrefix(n.Payload, prefix)
		if !ok {
			continue // another schema's ledger
		}
		if tenant, key, ok := strings.Cut(rest, "\n"); ok {
			l.events.Publish(tenant, key)
		}
	}
}

// close stops the listening connection, if it ever started.
func (l *listener) close() {
	l.cancel()
	if l.started.Load() {
		<-l.done
	}
}
