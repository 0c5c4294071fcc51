package sqlite

import (
	"context"

	"github.com/idem-dev/idem"
)

var _ idem.DurabilityReporter = (*Store)(nil)

// Durability implements idem.DurabilityReporter: one file on one node.
func (s *Store) Durability(context.Context) (idem.Durability, error) {
	return idem.Durability{Mode: idem.DurabilitySingleNode}, nil
}
