package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem"
)

const keysUsage = `Usage:
  PROG keys release  --tenant ID --key KEY --token N [--note TEXT]
  PROG keys complete --tenant ID --key KEY --token N --status CODE [--header 'Name: value']... [--body TEXT] [--note TEXT]
  PROG keys review   --tenant ID --key KEY --token N --note TEXT

Resolves an orphaned key by hand, as an operator, on the store named by
IDEM_DATABASE_URL (migrations run first): the same rules as
POST /v1/admin/tenants/{id}/keys/{key}/resolve, and the same audit entry
(subject "cli", scope admin). --token is the record's current fencing token
(GET /v1/admin/tenants/{id}/keys/{key}). release and complete need an orphan
(lease run out); review is allowed while the lease runs. See the runbook in
the operating docs (/docs/operating/#resolving-orphans) for which to use.`

// headerFlags collects repeated --header 'Name: value' flags.
type headerFlags map[string]string

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok {
		return fmt.Errorf("want 'Name: value', got %q", v)
	}
	h[strings.TrimSpace(name)] = strings.TrimSpace(value)
	return nil
}

func runKeys(ctx context.Context, e env, args []string) int {
	if _, code, ok := e.groupHelp(args, keysUsage); ok {
		return code
	}
	action := idem.ResolveAction(args[0])
	if !action.Valid() {
		fmt.Fprintf(e.stderr, "%s: unknown keys command %q (want release, complete or review)\n", e.prog, args[0])
		return 2
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id of the key")
	key := fs.String("key", "", "the idempotency key")
	token := fs.Int64("token", 0, "the record's current fencing token")
	note := fs.String("note", "", "why, for the audit log (required for review)")
	var status *int
	var body *string
	headers := headerFlags{}
	if action == idem.ResolveComplete {
		status = fs.Int("status", 0, "status of the response to store")
		body = fs.String("body", "", "body of the response to store (UTF-8 text)")
		fs.Var(headers, "header", "a header of the response to store, 'Name: value' (repeatable)")
	}
	cfg, done, code := loadConfigNoArgs(e, fs, settingsUsage(e, fs, keysUsage), args[1:], storeSettings...)
	if done {
		return code
	}
	if *tenant == "" || *key == "" || *token == 0 {
		fmt.Fprintf(e.stderr, "%s: keys %s needs --tenant, --key and --token\n", e.prog, action)
		return 2
	}
	p := idem.ResolveParams{TenantID: *tenant, Key: *key, Action: action, FencingToken: *token, Note: *note,
		Actor: idem.Actor{Subject: "cli", Scope: "admin"}}
	if action == idem.ResolveComplete {
		if idem.ValidateResponseStatus(*status) != nil {
			fmt.Fprintf(e.stderr, "%s: keys complete needs --status between 100 and 599\n", e.prog)
			return 2
		}
		p.Response = &idem.Response{Status: *status, Headers: headers, Body: []byte(*body), BodyEncoding: idem.BodyEncodingUTF8}
	}
	err := idem.ValidateKey(p.Key)
	if err == nil {
		err = p.Validate()
	}
	if err == nil && p.Response != nil {
		err = idem.ValidateResponseHeaders(p.Response.Headers)
	}
	if err != nil {
		return fail(e, "keys %s: %s", action, describe(err))
	}

	ctx, store, closeStore, err := openCommandStore(ctx, cfg)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer closeStore()
	t, err := store.GetTenant(ctx, idem.GetTenantParams{ID: p.TenantID})
	if err != nil {
		return fail(e, "keys %s: %s", action, describe(err))
	}
	if p.Response != nil && p.Response.Size() > t.Settings.MaxResponseBytes {
		return fail(e, "keys complete: the response is %d bytes; tenant %s allows max_response_bytes %d", p.Response.Size(), t.ID, t.Settings.MaxResponseBytes)
	}
	res, err := store.Resolve(ctx, p)
	if err != nil {
		return fail(e, "keys %s %s/%s: %s", action, p.TenantID, p.Key, describe(err))
	}
	out := map[string]any{
		"action":        res.Audit.Action,
		"tenant":        res.Audit.TenantID,
		"key":           res.Audit.Key,
		"audit_id":      res.Audit.ID,
		"fencing_token": res.Audit.FencingToken,
		"at":            res.Audit.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	if action != idem.ResolveRelease {
		out["state"] = res.Record.APIState()
	}
	if res.Audit.NewFencingToken != 0 {
		out["new_fencing_token"] = res.Audit.NewFencingToken
	}
	return printJSON(e, out)
}
