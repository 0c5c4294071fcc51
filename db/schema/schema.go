// Package schema holds the goose migrations of both stores, one folder per
// engine; sqlc reads the same files as the schema. PostgreSQL names are
// never schema-qualified, so its migrations apply inside whatever schema
// search_path selects.
package schema

import (
	"embed"
	"io/fs"
)

//go:embed postgres/*.sql sqlite/*.sql
var migrations embed.FS

// Postgres returns the PostgreSQL migrations, rooted at their folder, for a
// goose provider.
func Postgres() fs.FS { return sub("postgres") }

// SQLite returns the SQLite migrations, rooted at their folder, for a goose
// provider.
func SQLite() fs.FS { return sub("sqlite") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(migrations, dir)
	if err != nil {
		panic("schema: " + err.Error()) // dir is one of the embedded folders
	}
	return f
}
