// Package postgres holds the goose migrations of the PostgreSQL store. sqlc
// reads the same files as the schema. Names are never schema-qualified, so
// the migrations apply inside whatever schema search_path selects.
package postgres

import (
	"embed"
	"io/fs"
)

//go:embed *.sql
var migrations embed.FS

// Migrations returns the migration files, rooted at the folder that holds
// them, for a goose provider.
func Migrations() fs.FS { return migrations }
