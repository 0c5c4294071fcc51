package sqlite

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	sqlitelib "modernc.org/sqlite/lib"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/sqlite/internal/dbsqlc"
)

var _ idem.WebhookStore = (*Store)(nil)

// enqueueEvent writes ev to the outbox, one row per enabled endpoint of its
// tenant whose filter takes it, through q: call it with the transaction's
// queries so the event commits or rolls back with the change it reports.
// This is the one way an event enters the outbox (key.resolved included).
func enqueueEvent(ctx context.Context, q *dbsqlc.Queries, ev idem.Event, now time.Time) error {
	if _, err := q.EnqueueEvent(ctx, dbsqlc.EnqueueEventParams{
		EventID: ev.ID, EventType: string(ev.Type), Payload: ev.Payload, Now: micros(now), TenantID: ev.TenantID,
	}); err != nil {
		return fmt.Errorf("queue %s event: %w", ev.Type, err)
	}
	return nil
}

// CreateWebhookEndpoint stores a tenant's endpoint.
func (s *Store) CreateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	var out idem.WebhookEndpoint
	err := s.write(ctx, "create webhook endpoint", func() error {
		row, err := s.q.CreateWebhookEndpoint(ctx, dbsqlc.CreateWebhookEndpointParams{
			TenantID: e.TenantID, ID: e.ID, Url: e.URL, Secret: e.Secret,
			Events: idem.EventFilter(e.Events), Enabled: boolInt(e.Enabled), Now: micros(s.clock()),
			MaxEndpoints: idem.MaxWebhookEndpoints,
		})
		if sqliteCode(err) == sqlitelib.SQLITE_CONSTRAINT_FOREIGNKEY {
			return idem.TenantUnknown(e.TenantID, err)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return idem.WebhookLimitReached()
		}
		out = endpointFromRow(row)
		return err
	})
	return out, err
}

// GetWebhookEndpoint reads one endpoint.
func (s *Store) GetWebhookEndpoint(ctx context.Context, p idem.GetWebhookEndpointParams) (idem.WebhookEndpoint, error) {
	row, err := s.q.GetWebhookEndpoint(ctx, dbsqlc.GetWebhookEndpointParams{TenantID: p.TenantID, ID: p.ID})
	if errors.Is(err, sql.ErrNoRows) {
		return idem.WebhookEndpoint{}, idem.WebhookNotFound(p.ID)
	}
	if err != nil {
		return idem.WebhookEndpoint{}, s.interpretError(err, "get webhook endpoint")
	}
	return endpointFromRow(row), nil
}

// ListWebhookEndpoints lists a tenant's endpoints.
func (s *Store) ListWebhookEndpoints(ctx context.Context, p idem.ListWebhookEndpointsParams) ([]idem.WebhookEndpoint, error) {
	rows, err := s.q.ListWebhookEndpoints(ctx, p.TenantID)
	if err != nil {
		return nil, s.interpretError(err, "list webhook endpoints")
	}
	return fromRows(rows, endpointFromRow), nil
}

// UpdateWebhookEndpoint replaces an endpoint's URL, filter and flag.
func (s *Store) UpdateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	var out idem.WebhookEndpoint
	err := s.write(ctx, "update webhook endpoint", func() error {
		row, err := s.q.UpdateWebhookEndpoint(ctx, dbsqlc.UpdateWebhookEndpointParams{
			Url: e.URL, Events: idem.EventFilter(e.Events), Enabled: boolInt(e.Enabled),
			Now: micros(s.clock()), TenantID: e.TenantID, ID: e.ID,
		})
		if errors.Is(err, sql.ErrNoRows) {
			return idem.WebhookNotFound(e.ID)
		}
		out = endpointFromRow(row)
		return err
	})
	return out, err
}

// DeleteWebhookEndpoint deletes an endpoint and its deliveries.
func (s *Store) DeleteWebhookEndpoint(ctx context.Context, p idem.DeleteWebhookEndpointParams) error {
	return s.write(ctx, "delete webhook endpoint", func() error {
		n, err := s.q.DeleteWebhookEndpoint(ctx, dbsqlc.DeleteWebhookEndpointParams{TenantID: p.TenantID, ID: p.ID})
		if err == nil && n == 0 {
			return idem.WebhookNotFound(p.ID)
		}
		return err
	})
}

// SendTestEvent queues p.Event for one enabled endpoint.
func (s *Store) SendTestEvent(ctx context.Context, p idem.SendTestEventParams) (idem.WebhookDelivery, error) {
	var out idem.WebhookDelivery
	err := s.write(ctx, "queue test event", func() error {
		now := s.clock()
		row, err := s.q.EnqueueTestEvent(ctx, dbsqlc.EnqueueTestEventParams{
			EventID: p.Event.ID, EventType: string(p.Event.Type), Payload: p.Event.Payload, Now: micros(now),
			TenantID: p.Event.TenantID, EndpointID: p.EndpointID,
		})
		if errors.Is(err, sql.ErrNoRows) {
			return idem.ErrWebhookNotFound
		}
		out = deliveryFromRow(row, now)
		return err
	})
	if errors.Is(err, idem.ErrWebhookNotFound) {
		return out, s.testSendRefused(ctx, p.Event.TenantID, p.EndpointID)
	}
	return out, err
}

// testSendRefused says why a test send queued nothing: the endpoint is
// missing, or it exists but is disabled.
func (s *Store) testSendRefused(ctx context.Context, tenantID, endpointID string) error {
	if _, err := s.GetWebhookEndpoint(ctx, idem.GetWebhookEndpointParams{TenantID: tenantID, ID: endpointID}); err != nil {
		return err
	}
	return idem.WebhookDisabled(endpointID)
}

// ListWebhookDeliveries pages an endpoint's delivery log.
func (s *Store) ListWebhookDeliveries(ctx context.Context, p idem.ListWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	rows, err := s.q.ListWebhookDeliveries(ctx, dbsqlc.ListWebhookDeliveriesParams{
		TenantID: p.TenantID, EndpointID: p.EndpointID, BeforeID: p.BeforeID, RowLimit: int64(p.Limit),
	})
	if err != nil {
		return nil, s.interpretError(err, "list webhook deliveries")
	}
	now := s.clock()
	out := make([]idem.WebhookDelivery, 0, len(rows))
	for _, r := range rows {
		out = append(out, deliveryFromRow(dbsqlc.WebhookDelivery{
			ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID, EventType: r.EventType,
			State: r.State, Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt, CreatedAt: r.CreatedAt,
			LastAttemptAt: r.LastAttemptAt, LastStatus: r.LastStatus, LastError: r.LastError, DeliveredAt: r.DeliveredAt,
		}, now))
	}
	return out, nil
}

// ClaimWebhookDeliveries takes due deliveries, at most p.PerTenant of each
// tenant (see DueWebhookDeliveries), in one transaction in the writer
// slot: SQLite has one writer, so two claimers never take one row.
//
// p.Served goes to the query as a JSON object keyed by "t" and the tenant
// id in upper-case hex (as SQLite's hex() spells it): a JSON path label
// that needs no quoting whatever the id holds.
func (s *Store) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	byLabel := make(map[string]int64, len(p.Served))
	for tenant, n := range p.Served {
		byLabel["t"+strings.ToUpper(hex.EncodeToString([]byte(tenant)))] = n
	}
	servedJSON, err := json.Marshal(byLabel)
	if err != nil {
		return nil, err
	}
	// An empty outbox is the common case: look without the writer slot
	// first (a read beside the writer in WAL mode), so an idle poll never
	// queues behind or delays the ledger's writes.
	due, err := s.q.DueWebhookDeliveries(ctx, dbsqlc.DueWebhookDeliveriesParams{Now: micros(s.clock()), PerTenant: 1, RowLimit: 1, Served: "{}"})
	if err != nil {
		return nil, s.interpretError(err, "claim webhook deliveries")
	}
	if len(due) == 0 {
		return nil, nil
	}
	var out []idem.WebhookDelivery
	err = s.inTx(ctx, "claim webhook deliveries", func(q *dbsqlc.Queries, now time.Time) error {
		rows, err := q.DueWebhookDeliveries(ctx, dbsqlc.DueWebhookDeliveriesParams{
			Now: micros(now), PerTenant: int64(max(p.PerTenant, 1)), RowLimit: int64(p.Limit), Served: string(servedJSON),
		})
		if err != nil {
			return fmt.Errorf("read due deliveries: %w", err)
		}
		out = make([]idem.WebhookDelivery, 0, len(rows))
		for _, r := range rows {
			if err := q.LeaseWebhookDelivery(ctx, dbsqlc.LeaseWebhookDeliveryParams{
				Now: microsPtr(now), LeaseUntil: micros(now.Add(p.Lease)), ID: r.ID,
			}); err != nil {
				return fmt.Errorf("lease delivery: %w", err)
			}
			d := deliveryFromRow(dbsqlc.WebhookDelivery{
				ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID, EventType: r.EventType,
				Payload: r.Payload, State: r.State, Attempts: r.Attempts + 1, NextAttemptAt: micros(now.Add(p.Lease)),
				CreatedAt: r.CreatedAt, LastAttemptAt: microsPtr(now), LastStatus: r.LastStatus,
				LastError: r.LastError, DeliveredAt: r.DeliveredAt,
			}, now)
			d.URL, d.Secret = r.Url, r.Secret
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// FinishWebhookDelivery records an attempt's outcome and the endpoint's
// failure streak in one transaction.
func (s *Store) FinishWebhookDelivery(ctx context.Context, p idem.FinishWebhookDeliveryParams) error {
	return s.inTx(ctx, "finish webhook delivery", func(q *dbsqlc.Queries, now time.Time) error {
		arg := dbsqlc.FinishWebhookDeliveryParams{
			State: string(idem.DeliveryFailed), NextAttemptAt: micros(now), ID: p.ID, Attempts: int64(p.Attempts),
		}
		switch {
		case p.OK:
			arg.State, arg.DeliveredAt = string(idem.DeliveryDelivered), microsPtr(now)
		case p.RetryIn > 0:
			arg.State, arg.NextAttemptAt = string(idem.DeliveryPending), micros(now.Add(p.RetryIn))
		}
		if p.Status != 0 {
			st := int64(p.Status)
			arg.LastStatus = &st
		}
		if p.Error != "" {
			arg.LastError = &p.Error
		}
		row, err := q.FinishWebhookDelivery(ctx, arg)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // claimed again since: the newer attempt reports
		}
		if err != nil {
			return fmt.Errorf("update delivery: %w", err)
		}
		if p.OK {
			return q.RecordEndpointSuccess(ctx, dbsqlc.RecordEndpointSuccessParams{TenantID: row.TenantID, ID: row.EndpointID})
		}
		_, err = q.RecordEndpointFailure(ctx, dbsqlc.RecordEndpointFailureParams{
			Now: micros(now), MinFailures: int64(p.DisableMinFailures), DisableBefore: microsPtr(now.Add(-p.DisableAfter)),
			TenantID: row.TenantID, ID: row.EndpointID,
		})
		return err
	})
}

// EmitOrphanEvents marks unreported orphans and queues key.orphaned for
// each, in one transaction.
func (s *Store) EmitOrphanEvents(ctx context.Context, p idem.EmitOrphanEventsParams) (int, error) {
	var n int
	err := s.inTx(ctx, "emit orphan events", func(q *dbsqlc.Queries, now time.Time) error {
		rows, err := q.OrphansToReport(ctx, dbsqlc.OrphansToReportParams{Now: micros(now), RowLimit: int64(p.Limit)})
		if err != nil {
			return fmt.Errorf("read orphans: %w", err)
		}
		for _, rec := range listRecords(rows, now) {
			if err := q.MarkOrphanReported(ctx, dbsqlc.MarkOrphanReportedParams{TenantID: rec.TenantID, Key: rec.Key}); err != nil {
				return fmt.Errorf("mark orphan: %w", err)
			}
			ev, err := eventpayload.RecordEvent(idem.EventKeyOrphaned, rec, now)
			if err != nil {
				return err
			}
			if err := enqueueEvent(ctx, q, ev, now); err != nil {
				return err
			}
		}
		n = len(rows)
		return nil
	})
	return n, err
}

// PurgeWebhookDeliveries deletes finished deliveries older than p.OlderThan.
func (s *Store) PurgeWebhookDeliveries(ctx context.Context, p idem.PurgeWebhookDeliveriesParams) (int, error) {
	var n int64
	err := s.write(ctx, "purge webhook deliveries", func() error {
		var err error
		n, err = s.q.PurgeWebhookDeliveries(ctx, dbsqlc.PurgeWebhookDeliveriesParams{
			Before: micros(s.clock().Add(-p.OlderThan)), RowLimit: int64(p.Limit),
		})
		return err
	})
	return int(n), err
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func endpointFromRow(r dbsqlc.WebhookEndpoint) idem.WebhookEndpoint {
	e := idem.WebhookEndpoint{
		TenantID: r.TenantID, ID: r.ID, URL: r.Url, Secret: r.Secret,
		Events: idem.ParseEventFilter(r.Events), Enabled: r.Enabled != 0,
		ConsecutiveFailures: int(r.ConsecutiveFailures), FailingSince: timeOrZero(r.FailingSince),
		CreatedAt: timeOf(r.CreatedAt), UpdatedAt: timeOf(r.UpdatedAt),
	}
	if r.DisabledReason != nil {
		e.DisabledReason = *r.DisabledReason
	}
	return e
}

func deliveryFromRow(r dbsqlc.WebhookDelivery, now time.Time) idem.WebhookDelivery {
	d := idem.WebhookDelivery{
		ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID,
		EventType: idem.EventType(r.EventType), Payload: r.Payload, State: idem.DeliveryState(r.State),
		Attempts: int(r.Attempts), NextAttemptAt: timeOf(r.NextAttemptAt), CreatedAt: timeOf(r.CreatedAt),
		LastAttemptAt: timeOrZero(r.LastAttemptAt), DeliveredAt: timeOrZero(r.DeliveredAt), ObservedAt: now,
	}
	if r.LastStatus != nil {
		d.LastStatus = int(*r.LastStatus)
	}
	if r.LastError != nil {
		d.LastError = *r.LastError
	}
	return d
}
