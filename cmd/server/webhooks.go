package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/eventpayload"
	"github.com/idem-dev/idem/webhooks"
)

const webhooksUsage = `Usage:
  PROG webhooks create     --tenant ID --url URL [--events key.orphaned,key.lease_lost]
  PROG webhooks list       --tenant ID
  PROG webhooks set        --tenant ID --id EP [--url URL] [--events LIST] [--enabled=true|false]
  PROG webhooks delete     --tenant ID --id EP
  PROG webhooks test       --tenant ID --id EP
  PROG webhooks deliveries --tenant ID --id EP [--limit N]

Manages a tenant's signed webhook endpoints on the store named by
IDEM_DATABASE_URL, with the rules of /v1/webhooks: create prints the
signing secret, this once; --events '' (or none) subscribes to every event
type (key.orphaned, key.reaped_in_flight, key.resolved, key.lease_lost);
private, loopback and link-local URLs need IDEM_WEBHOOK_ALLOW_PRIVATE.
Running servers deliver what is queued; set --enabled=true re-enables an
endpoint the server disabled after sustained failure.`

func runWebhooks(ctx context.Context, e env, args []string) int {
	if _, code, ok := e.groupHelp(args, webhooksUsage); ok {
		return code
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("webhooks "+sub, flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id")
	var id, url, events *string
	var enabled *bool
	var limit *int
	settings := storeSettings
	switch sub {
	case "create", "set":
		url = fs.String("url", "", "endpoint URL (http or https)")
		events = fs.String("events", "", "event types, comma-separated ('' = every type)")
		settings = append(append([]string(nil), storeSettings...), "webhook-allow-private")
		if sub == "set" {
			id = fs.String("id", "", "endpoint id (ep_…)")
			enabled = fs.Bool("enabled", true, "enable (true) or disable (false) the endpoint")
		}
	case "list":
	case "delete", "test", "deliveries":
		id = fs.String("id", "", "endpoint id (ep_…)")
		if sub == "deliveries" {
			limit = fs.Int("limit", 50, "most entries to print, newest first")
		}
	default:
		fmt.Fprintf(e.stderr, "%s: unknown webhooks command %q (want create, list, set, delete, test or deliveries)\n", e.prog, sub)
		return 2
	}
	cfg, done, code := loadConfigNoArgs(e, fs, settingsUsage(e, fs, webhooksUsage), args, settings...)
	if done {
		return code
	}
	need := "--tenant"
	switch {
	case id != nil:
		need += " and --id"
	case sub == "create":
		need += " and --url"
	}
	if *tenant == "" || (id != nil && *id == "") || (sub == "create" && *url == "") {
		fmt.Fprintf(e.stderr, "%s: webhooks %s needs %s\n", e.prog, sub, need)
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	ctx, store, closeStore, err := openCommandStore(ctx, cfg)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer closeStore()
	ws := store.Webhooks()
	if ws == nil {
		return fail(e, "the store keeps no webhooks")
	}

	switch sub {
	case "create":
		ep, err := webhooks.NewEndpoint(*tenant, *url, parseEvents(*events), true, cfg.Webhooks.AllowPrivate)
		if err == nil {
			ep, err = ws.CreateWebhookEndpoint(ctx, ep)
		}
		if err != nil {
			return fail(e, "webhooks create: %s", describe(err))
		}
		out := endpointOut(ep)
		out["secret"] = ep.Secret
		return printJSON(e, out)
	case "list":
		list, err := ws.ListWebhookEndpoints(ctx, idem.ListWebhookEndpointsParams{TenantID: *tenant})
		if err != nil {
			return fail(e, "webhooks list: %s", describe(err))
		}
		return printJSON(e, each(list, endpointOut))
	case "set":
		ep, err := ws.GetWebhookEndpoint(ctx, idem.GetWebhookEndpointParams{TenantID: *tenant, ID: *id})
		if err != nil {
			return fail(e, "webhooks set: %s", describe(err))
		}
		var patch webhooks.EndpointPatch
		if given["url"] {
			patch.URL = url
		}
		if given["events"] {
			evs := parseEvents(*events)
			patch.Events = &evs
		}
		if given["enabled"] {
			patch.Enabled = enabled
		}
		err = patch.Apply(&ep, cfg.Webhooks.AllowPrivate)
		if err == nil {
			ep, err = ws.UpdateWebhookEndpoint(ctx, ep)
		}
		if err != nil {
			return fail(e, "webhooks set: %s", describe(err))
		}
		return printJSON(e, endpointOut(ep))
	case "delete":
		if err := ws.DeleteWebhookEndpoint(ctx, idem.DeleteWebhookEndpointParams{TenantID: *tenant, ID: *id}); err != nil {
			return fail(e, "webhooks delete: %s", describe(err))
		}
		fmt.Fprintf(e.stdout, "deleted webhook endpoint %s of tenant %s\n", *id, *tenant)
		return 0
	case "test":
		ev, err := eventpayload.NewEvent(*tenant, idem.EventWebhookTest, time.Now(), map[string]string{"endpoint_id": *id})
		if err == nil {
			var d idem.WebhookDelivery
			if d, err = ws.SendTestEvent(ctx, idem.SendTestEventParams{EndpointID: *id, Event: ev}); err == nil {
				return printJSON(e, deliveryOut(d))
			}
		}
		return fail(e, "webhooks test: %s", describe(err))
	default: // deliveries
		if *limit < 1 || *limit > 1000 {
			fmt.Fprintf(e.stderr, "%s: --limit must be between 1 and 1000\n", e.prog)
			return 2
		}
		if _, err := ws.GetWebhookEndpoint(ctx, idem.GetWebhookEndpointParams{TenantID: *tenant, ID: *id}); err != nil {
			return fail(e, "webhooks deliveries: %s", describe(err))
		}
		ds, err := ws.ListWebhookDeliveries(ctx, idem.ListWebhookDeliveriesParams{TenantID: *tenant, EndpointID: *id, Limit: *limit})
		if err != nil {
			return fail(e, "webhooks deliveries: %s", describe(err))
		}
		return printJSON(e, each(ds, deliveryOut))
	}
}

// parseEvents splits a comma-separated --events value (” = every type).
func parseEvents(s string) []idem.EventType {
	var out []idem.EventType
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, idem.EventType(p))
		}
	}
	return out
}

func endpointOut(ep idem.WebhookEndpoint) map[string]any {
	events := ep.Events
	if events == nil {
		events = []idem.EventType{}
	}
	out := map[string]any{
		"id": ep.ID, "tenant": ep.TenantID, "url": ep.URL, "events": events, "enabled": ep.Enabled,
		"consecutive_failures": ep.ConsecutiveFailures, "created_at": ep.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	if ep.DisabledReason != "" {
		out["disabled_reason"] = ep.DisabledReason
	}
	return out
}

func deliveryOut(d idem.WebhookDelivery) map[string]any {
	out := map[string]any{
		"id": d.ID, "event_id": d.EventID, "event_type": d.EventType, "state": d.State, "attempts": d.Attempts,
		"created_at": d.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	if d.LastStatus != 0 {
		out["last_status"] = d.LastStatus
	}
	if d.LastError != "" {
		out["last_error"] = d.LastError
	}
	return out
}
