// Package web embeds the static sites the server serves: the integrator docs
// under /docs/ and the orphan-key dashboard under /dashboard/. Every asset is
// vendored; nothing is loaded from a CDN.
package web

import (
	"embed"
	"io/fs"
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
