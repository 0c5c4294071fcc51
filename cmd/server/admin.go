package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/tenants"
)

func runToken(_ context.Context, e env, args []string) int {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	tenant := fs.String("tenant", "", "tenant id the token acts for (empty for an operator token)")
	scope := fs.String("scope", "", `space-separated scopes: keys:write, keys:read, tenant:admin, admin`)
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	subject := fs.String("subject", "cli", "sub claim of the token")
	usage := settingsUsage(e, fs, `Usage: PROG token --tenant ID --scope "keys:write" [--ttl 24h]

Mints an HS256 token with IDEM_JWT_HS256_SECRET (in development mode: with
the secret file the server generated in its data folder) and prints it on
stdout. It never creates a secret: without one it fails and says where it
looked. Issuer and audience are IDEM_JWT_ISSUER and IDEM_JWT_AUDIENCE.

Examples:
  PROG token --tenant acme --scope "keys:write"
  PROG token --scope admin --ttl 1h`)
	cfg, done, code := loadConfigNoArgs(e, fs, usage, args, tokenSettings...)
	if done {
		return code
	}
	scopes := strings.Fields(*scope)
	if len(scopes) == 0 {
		fmt.Fprintf(e.stderr, "%s: --scope is required, e.g. --scope \"keys:write\" or --scope admin\n", e.prog)
		return 2
	}
	for _, s := range scopes {
		switch s {
		case auth.ScopeKeysWrite, auth.ScopeKeysRead, auth.ScopeTenantAdmin, auth.ScopeAdmin:
		default:
			fmt.Fprintf(e.stderr, "%s: unknown scope %q (want keys:write, keys:read, tenant:admin or admin)\n", e.prog, s)
			return 2
		}
	}
	if *tenant == "" && !(len(scopes) == 1 && scopes[0] == auth.ScopeAdmin) {
		fmt.Fprintf(e.stderr, "%s: --tenant is required unless the only scope is admin\n", e.prog)
		return 2
	}
	if *tenant != "" {
		if err := idem.ValidateTenantID(*tenant); err != nil {
			fmt.Fprintf(e.stderr, "%s: --tenant %q: must be 1-64 characters of [a-z0-9_-]\n", e.prog, *tenant)
			return 2
		}
	}
	if *ttl <= 0 {
		fmt.Fprintf(e.stderr, "%s: --ttl must be positive\n", e.prog)
		return 2
	}
	if cfg.JWTHS256Secret != "" && len(cfg.JWTHS256Secret) < auth.MinSecretBytes {
		fmt.Fprintf(e.stderr, "%s: IDEM_JWT_HS256_SECRET must be at least %d bytes (got %d)\n", e.prog, auth.MinSecretBytes, len(cfg.JWTHS256Secret))
		return 2
	}
	secret, err := server.MintingSecret(cfg)
	if err != nil {
		return fail(e, "%v", err)
	}
	tok, err := auth.MintHS256(secret, auth.MintClaims{
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience, Subject: *subject,
		Tenant: *tenant, Scopes: scopes, TTL: *ttl,
	})
	if err != nil {
		return fail(e, "%v", err)
	}
	fmt.Fprintln(e.stdout, tok)
	return 0
}

// optInt is an int or int64 flag that remembers whether it was given.
type optInt[T int | int64] struct{ v *T }

func (o *optInt[T]) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.FormatInt(int64(*o.v), 10)
}

func (o *optInt[T]) Set(s string) error {
	bits := 64
	if _, ok := any(T(0)).(int); ok {
		bits = strconv.IntSize
	}
	n, err := strconv.ParseInt(s, 10, bits)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	v := T(n)
	o.v = &v
	return nil
}

// settingsFlags registers one flag per tenant setting and returns the
// patch they build.
func settingsFlags(fs *flag.FlagSet) func() idem.SettingsPatch {
	var f [8]optInt[int]
	names := []string{"replay-window-seconds", "reaper-threshold-seconds", "lease-seconds-default", "lease-seconds-max", "max-response-bytes", "rate-limit-per-second", "max-wait-seconds", "retry-budget-percent"}
	help := []string{
		"how long a completed response is replayed (default 86400)",
		"how long any record is kept before the reaper deletes it (default 259200)",
		"lease of a claim that asks for none (default 30)",
		"longest lease a claim may ask for (default 3600)",
		"largest stored response in bytes (default 1048576)",
		"requests per second allowed, 0 for no limit (default 0)",
		"longest a claim of a key in flight may wait for its holder, 0 for no waiting (default 20)",
		"share of first attempts that retries may add per replica over 10 s before a retry gets 429 retry_budget_exhausted, 100 for no budget (default 10)",
	}
	for i := range names {
		fs.Var(&f[i], names[i], "tenant setting: "+help[i])
	}
	var quota optInt[int64]
	fs.Var(&quota, "storage-quota-bytes", "tenant setting: most bytes the tenant's records may store; at or over it, claims of new keys get 507 (default 1073741824)")
	return func() idem.SettingsPatch {
		return idem.SettingsPatch{
			ReplayWindowSeconds:    f[0].v,
			ReaperThresholdSeconds: f[1].v,
			LeaseSecondsDefault:    f[2].v,
			LeaseSecondsMax:        f[3].v,
			MaxResponseBytes:       f[4].v,
			RateLimitPerSecond:     f[5].v,
			MaxWaitSeconds:         f[6].v,
			RetryBudgetPercent:     f[7].v,
			StorageQuotaBytes:      quota.v,
		}
	}
}

const tenantUsage = `Usage:
  PROG tenant create ID [--name NAME] [setting flags]
  PROG tenant list [--json]
  PROG tenant set ID [--name NAME] [--disabled=true|false] [setting flags]
  PROG tenant delete ID --yes

Operates on the store named by IDEM_DATABASE_URL directly (migrations run
first). create and set print the tenant as JSON. Disabling is reversible and
keeps every record; delete removes the tenant and all of its records for
good, so it asks for --yes.`

func runTenant(ctx context.Context, e env, args []string) int {
	if w, code, ok := e.groupHelp(args, tenantUsage); ok {
		fmt.Fprintf(w, "\nRun '%s tenant create --help' for the flags.\n", e.prog)
		return code
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("tenant "+sub, flag.ContinueOnError)
	var (
		name     *string
		disabled *bool
		asJSON   *bool
		yes      *bool
		patch    func() idem.SettingsPatch
	)
	switch sub {
	case "create", "set":
		name = fs.String("name", "", "display name of the tenant")
		patch = settingsFlags(fs)
		if sub == "set" {
			disabled = fs.Bool("disabled", false, "disable (true) or re-enable (false) the tenant")
		}
	case "list":
		asJSON = fs.Bool("json", false, "print JSON instead of a table")
	case "delete":
		yes = fs.Bool("yes", false, "confirm that the tenant and all of its records are to be deleted")
	default:
		fmt.Fprintf(e.stderr, "%s: unknown tenant command %q (want create, list, set or delete)\n", e.prog, sub)
		return 2
	}
	cfg, pos, done, code := loadConfig(e, fs, settingsUsage(e, fs, tenantUsage), args, storeSettings...)
	if done {
		return code
	}
	wantArgs := 1
	if sub == "list" {
		wantArgs = 0
	}
	if len(pos) != wantArgs {
		fmt.Fprintf(e.stderr, "%s: tenant %s takes %d argument(s), got %d\n%s\n", e.prog, sub, wantArgs, len(pos), e.expand(tenantUsage))
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if sub == "delete" && !*yes {
		fmt.Fprintf(e.stderr, "%s: tenant delete removes tenant %s and all of its records for good; add --yes to confirm (to suspend it instead: tenant set %s --disabled=true)\n", e.prog, pos[0], pos[0])
		return 2
	}

	ctx, store, closeStore, err := openCommandStore(ctx, cfg)
	if err != nil {
		return fail(e, "%v", err)
	}
	defer closeStore()
	svc := tenants.NewService(store, 0)

	switch sub {
	case "list":
		list, err := svc.List(ctx)
		if err != nil {
			return fail(e, "list tenants: %s", describe(err))
		}
		return printTenants(e, list, *asJSON)
	case "create":
		n := *name
		if n == "" {
			n = pos[0]
		}
		t, err := svc.Create(ctx, pos[0], n, patch())
		if err != nil {
			return fail(e, "create tenant %s: %s", pos[0], describe(err))
		}
		return printJSON(e, toJSON(t))
	case "delete":
		if err := svc.Delete(ctx, pos[0]); err != nil {
			return fail(e, "delete tenant %s: %s", pos[0], describe(err))
		}
		fmt.Fprintf(e.stdout, "deleted tenant %s and all of its records\n", pos[0])
		return 0
	default: // set
		p := tenants.Patch{Settings: patch()}
		if given["name"] {
			p.Name = name
		}
		if given["disabled"] {
			p.Disabled = disabled
		}
		t, err := svc.Update(ctx, pos[0], p)
		if err != nil {
			return fail(e, "update tenant %s: %s", pos[0], describe(err))
		}
		return printJSON(e, toJSON(t))
	}
}

// printTenants writes list as JSON or as a table.
func printTenants(e env, list []idem.Tenant, asJSON bool) int {
	if asJSON {
		return printJSON(e, each(list, toJSON))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tDISABLED\tREPLAY_WINDOW_S\tREAPER_THRESHOLD_S\tLEASE_DEFAULT_S\tLEASE_MAX_S\tMAX_RESPONSE_BYTES\tRATE_LIMIT\tMAX_WAIT_S\tRETRY_BUDGET_PCT\tSTORAGE_QUOTA_BYTES\tSTORED_BYTES")
	for _, t := range list {
		s := t.Settings
		fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", t.ID, t.Name, t.Disabled,
			s.ReplayWindowSeconds, s.ReaperThresholdSeconds, s.LeaseSecondsDefault, s.LeaseSecondsMax, s.MaxResponseBytes, s.RateLimitPerSecond, s.MaxWaitSeconds,
			s.RetryBudgetPercent, s.StorageQuotaBytes, t.StoredBytes)
	}
	if err := tw.Flush(); err != nil {
		return fail(e, "write: %v", err)
	}
	return 0
}

type tenantJSON struct {
	ID        string        `json:"id"`
	Name      string        `json:"name"`
	Disabled  bool          `json:"disabled"`
	Settings  idem.Settings `json:"settings"`
	Usage     usageJSON     `json:"usage"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// usageJSON is the tenant's usage, as the API's tenant shows it.
type usageJSON struct {
	StoredBytes int64 `json:"stored_bytes"`
}

func toJSON(t idem.Tenant) tenantJSON {
	return tenantJSON{ID: t.ID, Name: t.Name, Disabled: t.Disabled, Settings: t.Settings, Usage: usageJSON{StoredBytes: t.StoredBytes},
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

// each returns f of every item, in order: a JSON array, never null.
func each[T, U any](items []T, f func(T) U) []U {
	out := make([]U, 0, len(items))
	for _, it := range items {
		out = append(out, f(it))
	}
	return out
}

func printJSON(e env, v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(e, "write: %v", err)
	}
	return 0
}

// describe renders an error as the API would: a domain error by its detail
// and code (never the driver's message beneath it, e.g. a UNIQUE constraint
// for tenant_exists), with the invalid fields of an invalid_request.
func describe(err error) string {
	var ie *idem.Error
	if !errors.As(err, &ie) {
		return err.Error()
	}
	var b strings.Builder
	if ie.Detail != "" {
		fmt.Fprintf(&b, "%s (%s)", ie.Detail, ie.Code)
	} else {
		b.WriteString(err.Error())
	}
	for _, f := range ie.Fields {
		fmt.Fprintf(&b, "\n  %s: %s", f.Field, f.Message)
	}
	return b.String()
}

// openCommandStore opens the store for one CLI command (tenant, keys,
// webhooks) under one bound: the connect timeout plus 30 s for the command's
// own work. The returned func closes the store and ends the bound; call it
// when finished.
func openCommandStore(ctx context.Context, cfg server.Config) (context.Context, idem.Driver, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.DBConnectTimeout+30*time.Second)
	store, err := server.OpenStore(ctx, cfg)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, store, func() { store.Close(); cancel() }, nil
}
