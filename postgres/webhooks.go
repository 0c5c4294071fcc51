package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/postgres/internal/dbsqlc"
)

var _ idem.WebhookStore = (*Store)(nil)

// enqueueEvent writes ev to the outbox, one row per enabled endpoint of its
// tenant whose filter takes it, through q: call it with the transaction's
// queries so the event commits or rolls back with the change it reports.
// This is the one way an event enters the outbox (key.resolved included).
func (s *Store) enqueueEvent(ctx context.Context, q *dbsqlc.Queries, ev idem.Event) error {
	if _, err := q.EnqueueEvent(ctx, dbsqlc.EnqueueEventParams{
		EventID: ev.ID, EventType: string(ev.Type), Payload: ev.Payload, TenantID: ev.TenantID, Now: s.clock(),
	}); err != nil {
		return fmt.Errorf("queue %s event: %w", ev.Type, err)
	}
	return nil
}

// inTx runs fn in one transaction; fn's error rolls it back and is
// interpreted once as doing.
func (s *Store) inTx(ctx context.Context, doing string, fn func(q *dbsqlc.Queries) error) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(s.q.WithTx(tx)) })
	if err != nil {
		var e *idem.Error
		if errors.As(err, &e) && e.Code != idem.CodeInternal {
			return err
		}
		return s.interpretError(err, doing)
	}
	return nil
}

// queueLeaseLost queues key.lease_lost when a token-guarded write was
// refused with lease_lost. The refused write changed nothing, so there is
// no transaction to share: the event is written by the refusing call, in
// its own statement, before the refusal is answered; if it cannot be
// written the call answers store_unavailable instead, and the writer's
// retry writes it. Other refusals queue nothing.
func (s *Store) queueLeaseLost(ctx context.Context, stored *idem.Record, write string, token int64, verdict error) error {
	if stored == nil || !errors.Is(verdict, idem.ErrLeaseLost) {
		return verdict
	}
	ev, err := eventpayload.LeaseLostEvent(*stored, write, token, stored.ObservedAt)
	if err != nil {
		return err
	}
	if err := s.enqueueEvent(ctx, s.q, ev); err != nil {
		return s.interpretError(err, write+" key")
	}
	return verdict
}

// queueReaped queues key.reaped_in_flight for each in-flight record among
// reaped, through the reaper's transaction.
func (s *Store) queueReaped(ctx context.Context, q *dbsqlc.Queries, reaped []idem.Record) error {
	for _, rec := range reaped {
		if rec.State != idem.StateInFlight {
			continue
		}
		ev, err := eventpayload.RecordEvent(idem.EventKeyReapedInFlight, rec, rec.ObservedAt)
		if err != nil {
			return err
		}
		if err := s.enqueueEvent(ctx, q, ev); err != nil {
			return err
		}
	}
	return nil
}

// CreateWebhookEndpoint stores a tenant's endpoint.
func (s *Store) CreateWebhookEndpoint(ctx context.Context, e idem.WebhookEndpoint) (idem.WebhookEndpoint, error) {
	var out idem.WebhookEndpoint
	err := s.inTx(ctx, "create webhook endpoint", func(q *dbsqlc.Queries) error {
		// The tenant's row lock puts creates of one tenant one after the
		// other, so each counts the endpoints the one before created.
		if _, err := q.LockTenantEndpoints(ctx, e.TenantID); errors.Is(err, pgx.ErrNoRows) {
			return idem.TenantUnknown(e.TenantID, err)
		} else if err != nil {
			return err
		}
		row, err := q.CreateWebhookEndpoint(ctx, dbsqlc.CreateWebhookEndpointParams{
			TenantID: e.TenantID, ID: e.ID, Url: e.URL, Secret: e.Secret,
			Events: idem.EventFilter(e.Events), Enabled: e.Enabled, Now: s.clock(),
			MaxEndpoints: idem.MaxWebhookEndpoints,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return idem.WebhookLimitReached()
		}
		if err != nil {
			return err
		}
		out = endpointFromRow(row)
		return nil
	})
	return out, err
}

// GetWebhookEndpoint reads one endpoint.
func (s *Store) GetWebhookEndpoint(ctx context.Context, p idem.GetWebhookEndpointParams) (idem.WebhookEndpoint, error) {
	row, err := s.q.GetWebhookEndpoint(ctx, dbsqlc.GetWebhookEndpointParams{TenantID: p.TenantID, ID: p.ID})
	if errors.Is(err, pgx.ErrNoRows) {
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
	row, err := s.q.UpdateWebhookEndpoint(ctx, dbsqlc.UpdateWebhookEndpointParams{
		Url: e.URL, Events: idem.EventFilter(e.Events), Enabled: e.Enabled, TenantID: e.TenantID, ID: e.ID, Now: s.clock(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.WebhookEndpoint{}, idem.WebhookNotFound(e.ID)
	}
	if err != nil {
		return idem.WebhookEndpoint{}, s.interpretError(err, "update webhook endpoint")
	}
	return endpointFromRow(row), nil
}

// DeleteWebhookEndpoint deletes an endpoint and its deliveries.
func (s *Store) DeleteWebhookEndpoint(ctx context.Context, p idem.DeleteWebhookEndpointParams) error {
	n, err := s.q.DeleteWebhookEndpoint(ctx, dbsqlc.DeleteWebhookEndpointParams{TenantID: p.TenantID, ID: p.ID})
	if err != nil {
		return s.interpretError(err, "delete webhook endpoint")
	}
	if n == 0 {
		return idem.WebhookNotFound(p.ID)
	}
	return nil
}

// SendTestEvent queues p.Event for one enabled endpoint.
func (s *Store) SendTestEvent(ctx context.Context, p idem.SendTestEventParams) (idem.WebhookDelivery, error) {
	row, err := s.q.EnqueueTestEvent(ctx, dbsqlc.EnqueueTestEventParams{
		EventID: p.Event.ID, EventType: string(p.Event.Type), Payload: p.Event.Payload, TenantID: p.Event.TenantID,
		EndpointID: p.EndpointID, Now: s.clock(),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.WebhookDelivery{}, s.testSendRefused(ctx, p.Event.TenantID, p.EndpointID)
	}
	if err != nil {
		return idem.WebhookDelivery{}, s.interpretError(err, "queue test event")
	}
	return deliveryFromRow(row), nil
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
		TenantID: p.TenantID, EndpointID: p.EndpointID, BeforeID: p.BeforeID, RowLimit: int32(p.Limit),
	})
	if err != nil {
		return nil, s.interpretError(err, "list webhook deliveries")
	}
	out := make([]idem.WebhookDelivery, 0, len(rows))
	for _, r := range rows {
		out = append(out, deliveryFromRow(dbsqlc.WebhookDelivery{
			ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID, EventType: r.EventType,
			State: r.State, Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt, CreatedAt: r.CreatedAt,
			LastAttemptAt: r.LastAttemptAt, LastStatus: r.LastStatus, LastError: r.LastError, DeliveredAt: r.DeliveredAt,
		}))
	}
	return out, nil
}

// ClaimWebhookDeliveries takes due deliveries, at most p.PerTenant of each
// tenant, in one statement with FOR UPDATE SKIP LOCKED (see the query).
// p.Served goes to the query as a JSON object keyed by tenant id.
func (s *Store) ClaimWebhookDeliveries(ctx context.Context, p idem.ClaimWebhookDeliveriesParams) ([]idem.WebhookDelivery, error) {
	if p.Served == nil {
		p.Served = map[string]int64{}
	}
	servedJSON, err := json.Marshal(p.Served)
	if err != nil {
		return nil, err
	}
	rows, err := s.q.ClaimWebhookDeliveries(ctx, dbsqlc.ClaimWebhookDeliveriesParams{
		LeaseUs: micros(p.Lease), Now: s.clock(), RowLimit: int32(p.Limit), PerTenant: int32(max(p.PerTenant, 1)),
		Served: servedJSON,
	})
	if err != nil {
		return nil, s.interpretError(err, "claim webhook deliveries")
	}
	out := make([]idem.WebhookDelivery, 0, len(rows))
	for _, r := range rows {
		d := deliveryFromRow(dbsqlc.WebhookDelivery{
			ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID, EventType: r.EventType,
			Payload: r.Payload, State: r.State, Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt,
			CreatedAt: r.CreatedAt, LastAttemptAt: r.LastAttemptAt, LastStatus: r.LastStatus,
			LastError: r.LastError, DeliveredAt: r.DeliveredAt,
		})
		d.URL, d.Secret, d.ObservedAt = r.Url, r.Secret, timeOf(r.ObservedAt)
		out = append(out, d)
	}
	return out, nil
}

// FinishWebhookDelivery records an attempt's outcome and the endpoint's
// failure streak in one transaction. It locks the endpoint before the
// delivery, in the order deleting the endpoint or its tenant does.
func (s *Store) FinishWebhookDelivery(ctx context.Context, p idem.FinishWebhookDeliveryParams) error {
	return s.inTx(ctx, "finish webhook delivery", func(q *dbsqlc.Queries) error {
		if _, err := q.LockDeliveryEndpoint(ctx, p.ID); errors.Is(err, pgx.ErrNoRows) {
			return nil // deleted with its endpoint or tenant
		} else if err != nil {
			return fmt.Errorf("lock endpoint: %w", err)
		}
		arg := dbsqlc.FinishWebhookDeliveryParams{Ok: p.OK, ID: p.ID, Attempts: int32(p.Attempts), Now: s.clock()}
		if !p.OK {
			arg.RetryUs = micros(p.RetryIn)
		}
		if p.Status != 0 {
			st := int32(p.Status)
			arg.LastStatus = &st
		}
		if p.Error != "" {
			arg.LastError = &p.Error
		}
		row, err := q.FinishWebhookDelivery(ctx, arg)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // claimed again since: the newer attempt reports
		}
		if err != nil {
			return fmt.Errorf("update delivery: %w", err)
		}
		if p.OK {
			return q.RecordEndpointSuccess(ctx, dbsqlc.RecordEndpointSuccessParams{TenantID: row.TenantID, ID: row.EndpointID})
		}
		_, err = q.RecordEndpointFailure(ctx, dbsqlc.RecordEndpointFailureParams{
			MinFailures: int32(p.DisableMinFailures), DisableAfterUs: micros(p.DisableAfter),
			TenantID: row.TenantID, ID: row.EndpointID, Now: s.clock(),
		})
		return err
	})
}

// EmitOrphanEvents marks unreported orphans and queues key.orphaned for
// each, in one transaction; SKIP LOCKED keeps replicas from reporting one
// orphan twice.
func (s *Store) EmitOrphanEvents(ctx context.Context, p idem.EmitOrphanEventsParams) (int, error) {
	var n int
	err := s.inTx(ctx, "emit orphan events", func(q *dbsqlc.Queries) error {
		rows, err := q.MarkOrphans(ctx, dbsqlc.MarkOrphansParams{Now: s.clock(), RowLimit: int32(p.Limit)})
		if err != nil {
			return fmt.Errorf("mark orphans: %w", err)
		}
		for _, rec := range listRecords(rows) {
			ev, err := eventpayload.RecordEvent(idem.EventKeyOrphaned, rec, rec.ObservedAt)
			if err != nil {
				return err
			}
			if err := s.enqueueEvent(ctx, q, ev); err != nil {
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
	n, err := s.q.PurgeWebhookDeliveries(ctx, dbsqlc.PurgeWebhookDeliveriesParams{
		OlderThanUs: micros(p.OlderThan), RowLimit: int32(p.Limit), Now: s.clock(),
	})
	if err != nil {
		return 0, s.interpretError(err, "purge webhook deliveries")
	}
	return int(n), nil
}

func endpointFromRow(r dbsqlc.WebhookEndpoint) idem.WebhookEndpoint {
	e := idem.WebhookEndpoint{
		TenantID: r.TenantID, ID: r.ID, URL: r.Url, Secret: r.Secret,
		Events: idem.ParseEventFilter(r.Events), Enabled: r.Enabled,
		ConsecutiveFailures: int(r.ConsecutiveFailures), FailingSince: timeOf(r.FailingSince),
		CreatedAt: timeOf(r.CreatedAt), UpdatedAt: timeOf(r.UpdatedAt),
	}
	if r.DisabledReason != nil {
		e.DisabledReason = *r.DisabledReason
	}
	return e
}

func deliveryFromRow(r dbsqlc.WebhookDelivery) idem.WebhookDelivery {
	d := idem.WebhookDelivery{
		ID: r.ID, TenantID: r.TenantID, EndpointID: r.EndpointID, EventID: r.EventID,
		EventType: idem.EventType(r.EventType), Payload: r.Payload, State: idem.DeliveryState(r.State),
		Attempts: int(r.Attempts), NextAttemptAt: timeOf(r.NextAttemptAt), CreatedAt: timeOf(r.CreatedAt),
		LastAttemptAt: timeOf(r.LastAttemptAt), DeliveredAt: timeOf(r.DeliveredAt),
	}
	if r.LastStatus != nil {
		d.LastStatus = int(*r.LastStatus)
	}
	if r.LastError != nil {
		d.LastError = *r.LastError
	}
	return d
}
