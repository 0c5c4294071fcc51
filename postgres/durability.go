package postgres

import (
	"context"

	"github.com/idem-dev/idem"
)

// Durability implements idem.Driver from the settings of the
// store's session and pg_stat_replication (whose sync_state a role
// without pg_read_all_stats sees as NULL: counted as Hidden).
func (s *Store) Durability(ctx context.Context) (idem.Durability, error) {
	var d idem.Durability
	err := s.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication)::int,
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))::int,
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)::int`).
		Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.Standbys, &d.SyncStandbys, &d.Hidden)
	if err != nil {
		return idem.Durability{}, s.interpretError(err, "read the replication settings")
	}
	return idem.ClassifyDurability(d), nil
}
