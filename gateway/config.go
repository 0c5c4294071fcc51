package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/auth"
	"github.com/idem-dev/idem/client/frontdoor"
)

// File is the gateway's YAML configuration file. Every field is optional:
// an empty file (or none) proxies everything to the default upstream with
// the default policy.
//
//	upstreams:              # named upstreams; "default" is the --upstream flag unless set here
//	  billing: http://127.0.0.1:9000
//	defaults:               # policy of every route, and of paths no route matches
//	  lease: 30s
//	routes:
//	  - path: /v1/payments/{id}/refunds   # net/http ServeMux path pattern, matched in any case, trailing slash or not
//	    upstream: billing
//	    required_methods: [POST]
//	    optional_methods: [PUT, DELETE]
//	    scope_header: X-Account-Id     # or scope_jwt: {jwks_file: …, issuer: …, audience: …}
//	    lease: 2m
//	    max_wait: 10s      # longest a Prefer: wait=N request is held on a key in flight
//	    timeout: 90s
//	    store_5xx: true
//	    stored_headers: [Content-Type, Location]
//	    max_stored_bytes: 1048576
//	    max_body_bytes: 8388608
//	    fail_open: false
//	    fingerprint:
//	      exclude: [/client_timestamp]
//	      headers: [X-Api-Version]
type File struct {
	Upstreams map[string]string `yaml:"upstreams"`
	Defaults  Policy            `yaml:"defaults"`
	Routes    []RouteConfig     `yaml:"routes"`
	// ReplayCache overrides Options.ReplayCache (docs/frontdoor.md, "The
	// replay cache").
	ReplayCache *ReplayCacheConfig `yaml:"replay_cache"`
}

// ReplayCacheConfig is the file's replay_cache: the gateway answers a
// replay it had from the store again from memory, for at most max_age.
// Fields left out keep Options.ReplayCache's (the built-in defaults:
// enabled, 4096 entries, 8 MiB, 2s). A reload starts an empty cache.
type ReplayCacheConfig struct {
	Enabled    *bool    `yaml:"enabled"`
	MaxEntries int      `yaml:"max_entries"`
	MaxBytes   int64    `yaml:"max_bytes"`
	MaxAge     Duration `yaml:"max_age"`
}

// options applies c over o.
func (c *ReplayCacheConfig) options(o frontdoor.ReplayCacheOptions) (frontdoor.ReplayCacheOptions, error) {
	if c == nil {
		return o, nil
	}
	if c.MaxEntries < 0 || c.MaxBytes < 0 || c.MaxAge < 0 || time.Duration(c.MaxAge) > frontdoor.MaxReplayCacheMaxAge {
		return o, fmt.Errorf("replay_cache: max_entries and max_bytes must not be negative, max_age must be 0s..%s", frontdoor.MaxReplayCacheMaxAge)
	}
	if c.Enabled != nil {
		o.Off = !*c.Enabled
	}
	if c.MaxEntries > 0 {
		o.MaxEntries = c.MaxEntries
	}
	if c.MaxBytes > 0 {
		o.MaxBytes = c.MaxBytes
	}
	if c.MaxAge > 0 {
		o.MaxAge = time.Duration(c.MaxAge)
	}
	return o, nil
}

// RouteConfig is one route of the file: a path pattern, its upstream and
// the policy fields that differ from the defaults.
type RouteConfig struct {
	// Path is a net/http ServeMux path pattern ("/v1/orders/{id}",
	// "/v1/files/" for a prefix); it is the route in the operation label.
	// It matches a request's path in any ASCII case and with or without
	// trailing slashes (routing.match); two paths that differ only in case
	// are refused.
	Path string `yaml:"path"`
	// Upstream names an entry of upstreams; "" is "default".
	Upstream string `yaml:"upstream"`
	Policy   `yaml:",inline"`
}

// Policy is the per-route behaviour. Pointer and nil fields inherit from
// the defaults, then from the built-in defaults.
type Policy struct {
	// RequiredMethods must carry a key (built-in: POST, PATCH).
	RequiredMethods []string `yaml:"required_methods"`
	// OptionalMethods are protected when they carry a key (built-in: every
	// other unsafe method).
	OptionalMethods []string `yaml:"optional_methods"`
	// ScopeHeader names a request header whose value scopes the key (the
	// value with "%" and ":" escaped, ":" and the key: frontdoor.ScopedKey);
	// a protected request without it, with two such fields or with a list
	// (a comma) in it gets 400.
	ScopeHeader string `yaml:"scope_header"`
	// ScopeJWT scopes the key by the sub claim of the caller's bearer
	// token, verified against a JWKS; a protected request without a valid
	// token gets 400. Exclusive with ScopeHeader.
	ScopeJWT *JWTScope `yaml:"scope_jwt"`
	// Lease is the claim's lease; 0 takes the tenant's default. It is
	// renewed every third of it while the upstream call runs, and capped
	// by the tenant's lease_seconds_max (Gateway.leaseSeconds).
	Lease Duration `yaml:"lease"`
	// MaxWait caps how long a request with Prefer: wait=N (RFC 7240) is
	// held while its key is in flight, until the first request completes
	// (its response is replayed) or gives the key up (this one runs); past
	// it the 409 with Retry-After. Built-in: no cap of the route's own,
	// only the tenant's max_wait_seconds; 0s turns waiting off. Keep it
	// below the caller's and any proxy's timeout.
	MaxWait *Duration `yaml:"max_wait"`
	// Timeout bounds the upstream call (built-in 30s); past it the caller
	// gets 504, stored like a 5xx answer (the upstream had the request and
	// may have acted), or the key released with Store5xx false.
	Timeout Duration `yaml:"timeout"`
	// Store5xx stores and replays 5xx answers, and the 504 or 502 of an
	// upstream that had the request but did not answer (built-in true);
	// false releases the key on them.
	Store5xx *bool `yaml:"store_5xx"`
	// StoredHeaders are the response headers stored with the response
	// (built-in: frontdoor.DefaultStoredHeaders). Set-Cookie never is.
	StoredHeaders []string `yaml:"stored_headers"`
	// MaxStoredBytes is the largest response stored for replay (built-in
	// and cap: the tenant's max_response_bytes). A larger one is passed
	// through and recorded as completed without its body.
	MaxStoredBytes int `yaml:"max_stored_bytes"`
	// MaxBodyBytes bounds the request body the gateway reads to
	// fingerprint it (built-in 8 MiB); a larger one gets 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// FailOpen passes protected requests to the upstream unprotected when
	// the store fails, instead of answering 503. Off by default: a retry of
	// an unprotected request may run twice. A refusal by idem (the tenant
	// unknown or disabled, its storage quota used up) is no store failure
	// and is never passed through.
	FailOpen *bool `yaml:"fail_open"`
	// Fingerprint are the fingerprint rules: JSON pointers to leave out of
	// a JSON body, request headers to include.
	Fingerprint frontdoor.Rules `yaml:"fingerprint"`
}

// JWTScope verifies the caller's bearer token (Authorization: Bearer …)
// and takes its sub claim as the key scope. The gateway does not
// authenticate callers (the upstream still does): it only needs a scope
// the caller cannot choose freely.
type JWTScope struct {
	// JWKSFile holds the public keys (EdDSA, ES256, RS256) the tokens are
	// signed with.
	JWKSFile string `yaml:"jwks_file"`
	// Issuer and Audience must match the token's iss and aud.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
}

// Duration is a time.Duration written as "30s" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as 30s", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// Built-in defaults of a route.
const (
	DefaultTimeout      = 30 * time.Second
	DefaultMaxBodyBytes = 8 << 20
)

// route is one compiled route.
type route struct {
	pattern       string // "" for paths no route matches
	upstream      *url.URL
	upstreamName  string
	methods       frontdoor.Methods
	scopeHeader   string
	scopeJWT      *auth.Verifier
	lease         time.Duration
	maxWait       time.Duration // < 0: no cap of the route's own
	timeout       time.Duration
	store5xx      bool
	storedHeaders []string
	maxStored     int
	maxBody       int64
	failOpen      bool
	rules         frontdoor.Rules
}

// routing is one immutable snapshot of the configuration; a reload swaps
// the whole snapshot, so a request sees one configuration from start to
// end.
type routing struct {
	// mux holds the patterns folded to lower case (foldPath); it matches
	// a request's path folded the same way.
	mux      *http.ServeMux
	routes   map[string]*route // by folded pattern
	fallback *route
	// scoped says whether any route scopes its keys: then an unscoped key
	// may hold no ":" (frontdoor.ScopedKey), so that no unscoped request
	// writes a scoped caller's record.
	scoped bool
	// cache is the replay cache of the snapshot's requests (nil: off): a
	// reload starts an empty one, with the fingerprint rules it loads.
	cache *frontdoor.ReplayCache
	// leaseChecked is the tenant's lease_seconds_max the routes' leases
	// were last checked against (Gateway.leaseSeconds); 0 before the first
	// request of this snapshot.
	leaseChecked atomic.Int64
}

// all returns every route of the snapshot, the defaults included.
func (rt *routing) all() []*route {
	rs := make([]*route, 0, len(rt.routes)+1)
	for _, r := range rt.routes {
		rs = append(rs, r)
	}
	return append(rs, rt.fallback)
}

// name is the route's pattern, or "defaults" for paths no route matches.
func (r *route) name() string {
	if r.pattern == "" {
		return "defaults"
	}
	return r.pattern
}

// LoadFile reads and parses a configuration file; "" gives an empty one.
func LoadFile(path string) (File, error) {
	var f File
	if path == "" {
		return f, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("gateway config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return f, fmt.Errorf("gateway config %s: %w", path, err)
	}
	return f, nil
}

// compile checks the file and builds a routing snapshot. defaultUpstream is
// the --upstream flag, used when the file names no "default" upstream.
func compile(f File, defaultUpstream string) (*routing, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	ups := map[string]*url.URL{}
	raw := map[string]string{"default": defaultUpstream}
	for name, u := range f.Upstreams {
		raw[name] = u
	}
	for name, u := range raw {
		if u == "" {
			continue
		}
		parsed, err := url.Parse(u)
		if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			bad("upstream %q: %q is not an http:// or https:// URL", name, u)
			continue
		}
		ups[name] = parsed
	}
	build := func(where, pattern, upstream string, p Policy) *route {
		d := f.Defaults
		r := &route{pattern: pattern, upstreamName: upstream}
		if upstream == "" {
			r.upstreamName = "default"
		}
		r.upstream = ups[r.upstreamName]
		if r.upstream == nil {
			bad("%s: upstream %q is not configured (set --upstream or upstreams.%s)", where, r.upstreamName, r.upstreamName)
		}
		r.methods = frontdoor.Methods{Required: firstList(p.RequiredMethods, d.RequiredMethods), Optional: firstList(p.OptionalMethods, d.OptionalMethods)}
		for _, m := range append(append([]string{}, r.methods.Required...), r.methods.Optional...) {
			if m != strings.ToUpper(m) || m == "" || strings.ContainsAny(m, " \t") {
				bad("%s: method %q must be an upper-case HTTP method", where, m)
			}
		}
		r.scopeHeader = first(p.ScopeHeader, d.ScopeHeader)
		if js := firstPtr(p.ScopeJWT, d.ScopeJWT); js != nil {
			v, err := jwtVerifier(*js)
			if err != nil {
				bad("%s: scope_jwt: %v", where, err)
			}
			r.scopeJWT = v
		}
		if r.scopeHeader != "" && r.scopeJWT != nil {
			bad("%s: scope_header and scope_jwt exclude each other", where)
		}
		r.lease = time.Duration(first(p.Lease, d.Lease))
		r.maxWait = -1
		if mw := firstPtr(p.MaxWait, d.MaxWait); mw != nil {
			r.maxWait = time.Duration(*mw)
			if r.maxWait < 0 || r.maxWait%time.Second != 0 {
				bad("%s: max_wait must be a whole number of seconds, 0s or more", where)
			}
		}
		r.timeout = time.Duration(first(p.Timeout, d.Timeout, Duration(DefaultTimeout)))
		r.store5xx = firstBool(p.Store5xx, d.Store5xx, true)
		r.failOpen = firstBool(p.FailOpen, d.FailOpen, false)
		r.storedHeaders = firstList(p.StoredHeaders, d.StoredHeaders)
		r.maxStored = first(p.MaxStoredBytes, d.MaxStoredBytes)
		r.maxBody = first(p.MaxBodyBytes, d.MaxBodyBytes, DefaultMaxBodyBytes)
		r.rules = p.Fingerprint
		if len(r.rules.Exclude) == 0 {
			r.rules.Exclude = d.Fingerprint.Exclude
		}
		if len(r.rules.Headers) == 0 {
			r.rules.Headers = d.Fingerprint.Headers
		}
		if err := r.rules.Validate(); err != nil {
			bad("%s: fingerprint: %v", where, err)
		}
		if r.lease < 0 || r.lease%time.Second != 0 {
			bad("%s: lease must be a whole number of seconds", where)
		}
		if r.timeout <= 0 || r.maxStored < 0 || r.maxBody <= 0 {
			bad("%s: timeout, max_stored_bytes and max_body_bytes must be positive", where)
		}
		return r
	}
	rt := &routing{mux: http.NewServeMux(), routes: map[string]*route{}}
	rt.fallback = build("defaults", "", "", Policy{})
	first := map[string]string{} // folded pattern → the route that has it
	for i, rc := range f.Routes {
		where := fmt.Sprintf("routes[%d] (%s)", i, rc.Path)
		if !strings.HasPrefix(rc.Path, "/") {
			bad("%s: path must be a ServeMux path pattern starting with '/'", where)
			continue
		}
		if !frontdoor.ValidLabelText(rc.Path) {
			// The pattern names the route in the operation label, which idem
			// refuses with a control character: every claim would fail.
			bad("%s: path must not contain control characters", where)
			continue
		}
		folded := foldPattern(rc.Path)
		if prior, dup := first[folded]; dup {
			if prior == rc.Path {
				bad("%s: path is listed twice", where)
			} else {
				bad("%s: path differs from %s only in case; the gateway matches paths ignoring case, so one request would match either", where, prior)
			}
			continue
		}
		first[folded] = rc.Path
		r := build(where, rc.Path, rc.Upstream, rc.Policy)
		if err := register(rt.mux, folded); err != nil {
			bad("%s: %v (paths are matched ignoring case)", where, err)
			continue
		}
		rt.routes[folded] = r
	}
	for _, r := range rt.all() {
		rt.scoped = rt.scoped || r.scopeHeader != "" || r.scopeJWT != nil
	}
	return rt, errors.Join(errs...)
}

// register adds a pattern to mux; ServeMux panics on a bad or conflicting
// pattern, which a configuration reload must survive.
func register(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.HandleFunc(pattern, func(http.ResponseWriter, *http.Request) {})
	return nil
}

// match returns the route of r and the route string of its operation: the
// route's pattern as configured, or the path (frontdoor.PathRoute) when no
// route matches.
//
// A route matches its path in any ASCII case, with or without trailing
// slashes, and after ServeMux's cleaning (//, ., ..): upstreams often
// serve /PAY and /pay/ as /pay (Express, Spring, ASP.NET by default), and
// an exact match let such a spelling fall to the defaults, losing the
// route's scope and policy, so a caller could run the route's requests
// unscoped. Matching leniently errs towards protection: a spelling the
// upstream serves as another path still gets the route's policy, and its
// fingerprint (which has the path as sent) keeps it apart from the
// route's own path. The path sent upstream is the caller's, unchanged.
func (rt *routing) match(r *http.Request) (*route, string) {
	m := r
	if p := foldPath(r.URL.Path); p != r.URL.Path || r.URL.RawPath != "" {
		// Only a path that folding changes costs a request of its own.
		u := &url.URL{Path: p}
		if r.URL.RawPath != "" {
			u.RawPath = foldPath(r.URL.RawPath)
		}
		m = &http.Request{Method: r.Method, URL: u, Host: r.Host}
	}
	_, pattern := rt.mux.Handler(m)
	if rr, ok := rt.routes[pattern]; ok {
		return rr, rr.pattern
	}
	return rt.fallback, frontdoor.PathRoute(r)
}

// foldPath is a request path as routes match it: ASCII letters in lower
// case and trailing slashes cut ("/" stays "/"). A prefix route
// ("/files/") still matches its own path: ServeMux sends "/files" to it.
func foldPath(p string) string {
	p = strings.TrimRight(lowerASCII(p), "/")
	if p == "" {
		return "/"
	}
	return p
}

// foldPattern is a route's pattern as the mux holds it: in lower case
// (wildcard names too, which the gateway does not use), its trailing slash
// kept, since it makes the pattern a prefix.
func foldPattern(p string) string { return lowerASCII(p) }

// lowerASCII maps A-Z to a-z and leaves every other byte alone, so a
// path's escapes and UTF-8 stay as they are.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

func first[T comparable](vs ...T) T {
	var zero T
	for _, v := range vs {
		if v != zero {
			return v
		}
	}
	return zero
}

func firstPtr[T any](vs ...*T) *T {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

// jwtVerifier builds the verifier of a scope_jwt: public keys only.
func jwtVerifier(js JWTScope) (*auth.Verifier, error) {
	if js.JWKSFile == "" || js.Issuer == "" || js.Audience == "" {
		return nil, errors.New("jwks_file, issuer and audience are required")
	}
	b, err := os.ReadFile(js.JWKSFile)
	if err != nil {
		return nil, err
	}
	return auth.NewVerifier(auth.Config{JWKS: b, Issuer: js.Issuer, Audience: js.Audience})
}

func firstList(vs ...[]string) []string {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

func firstBool(a, b *bool, def bool) bool {
	switch {
	case a != nil:
		return *a
	case b != nil:
		return *b
	}
	return def
}

// mostHeld is the most one protected request of the route holds of the
// in-flight budget: its largest body, charged BodyMemoryFactor times, and
// its largest stored answer (max_stored_bytes, or the most any tenant may
// store when the route does not set it). fits and the callers' share both
// measure a route by it.
func (r *route) mostHeld() (body, answer int64) {
	answer = int64(idem.MaxResponseBytesLimit)
	if r.maxStored > 0 {
		answer = int64(min(r.maxStored, idem.MaxResponseBytesLimit))
	}
	return r.maxBody * BodyMemoryFactor, answer
}

// fits returns an error naming the routes whose largest request
// (route.mostHeld) could never fit a budget of limit bytes: every protected
// request of such a route would be refused server_busy.
func (rt *routing) fits(limit int64) error {
	var errs []error
	for _, r := range rt.all() {
		if body, answer := r.mostHeld(); body+answer > limit {
			errs = append(errs, fmt.Errorf("%s: max_body_bytes %d × %d plus max_stored_bytes %d is over the in-flight budget (IDEM_MAX_INFLIGHT_BYTES %d)",
				r.name(), r.maxBody, BodyMemoryFactor, answer, limit))
		}
	}
	return errors.Join(errs...)
}
