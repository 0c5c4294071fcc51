// Package web embeds the static sites the server serves: the integrator docs
// under /docs/ and the orphan-key dashboard under /dashboard/. Every asset is
// vendored; nothing is loaded from a CDN.
package web

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed docs dashboard
var files embed.FS

// Docs returns the integrator documentation site, rooted at web/docs.
func Docs() fs.FS { return sub("docs") }

// Dashboard returns the orphan-key dashboard, rooted at web/dashboard.
func Dashboard() fs.FS { return sub("dashboard") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		panic("web: embedded folder " + dir + " is missing: " + err.Error())
	}
	return f
}

// The Content-Security-Policy of the pages. The pages load only their own
// scripts, styles and images from this origin (every asset is vendored)
// and run no inline script, so a script injected into a page (say a
// tenant's text the dashboard shows, were it ever written as markup) does
// not run and could not send a token elsewhere; no page may be framed
// (clickjacking the dashboard's resolve button), no form submits anywhere
// (the token form is handled by script; without it, it must not put the
// token in a URL), and no <base> redirects relative links.
const (
	// DashboardCSP is the dashboard's policy: it calls the API and
	// /metrics on this origin; its favicon is a data: URL.
	DashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	// DocsCSP is the docs pages' policy: they fetch the example files
	// they show from this origin.
	DocsCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	// APIReferenceCSP is the policy of the API reference (docs/api/): the
	// vendored Redoc bundle fetches /openapi.yaml, writes its styles as
	// <style> elements at run time (styled-components: no hash can name
	// them, hence 'unsafe-inline' for styles, never for scripts) and runs
	// its search index in a worker made from a blob: URL.
	APIReferenceCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
		"connect-src 'self'; worker-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

// DocsHandler serves the docs site (paths relative to its root, as after
// http.StripPrefix) with the security headers (see secure).
func DocsHandler() http.Handler {
	return secure(http.FileServerFS(Docs()), func(path string) string {
		if strings.HasPrefix(strings.TrimPrefix(path, "/"), "api/") {
			return APIReferenceCSP
		}
		return DocsCSP
	})
}

// DashboardHandler serves the dashboard with the security headers (see
// secure).
func DashboardHandler() http.Handler {
	return secure(http.FileServerFS(Dashboard()), func(string) string { return DashboardCSP })
}

// secure sets, on every answer of h, the policy policy picks for the
// path, X-Frame-Options: DENY (frame-ancestors for browsers without CSP
// level 2), X-Content-Type-Options: nosniff (an asset is never run as
// another type than the one served) and Referrer-Policy: no-referrer (no
// URL of the pages leaves in a Referer).
func secure(h http.Handler, policy func(path string) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", policy(r.URL.Path))
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}
