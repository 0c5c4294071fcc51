// Package sqlite holds the goose migrations of the embedded SQLite store.
// sqlc reads the same files as the schema.
package sqlite

import (
	"embed"
	"io/fs"
)

//go:embed *.sql
var migrations embed.FS

// Migrations returns the migration files, rooted at the folder that holds
// them, for a goose provider.
func Migrations() fs.FS { return migrations }
