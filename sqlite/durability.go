package sqlite

import (
	"context"

	"github.com/idem-dev/idem"
)

// Durability implements idem.Driver: one file on one node.
func (s *Store) Durability(context.Context) (idem.Durability, error) {
	return idem.Durability{Mode: idem.DurabilitySingleNode}, nil
}
