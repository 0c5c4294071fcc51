package idem_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

func TestClassifyDurability(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   idem.Durability
		want string
	}{
		{"no standby", idem.Durability{SynchronousCommit: "on"}, idem.DurabilitySingleNode},
		{"async standbys", idem.Durability{SynchronousCommit: "on", Standbys: 2}, idem.DurabilityAsynchronous},
		{"a sync standby", idem.Durability{SynchronousCommit: "on", SynchronousStandbyNames: "ANY 1 (*)", Standbys: 2, SyncStandbys: 1}, idem.DurabilitySynchronous},
		{"remote_apply", idem.Durability{SynchronousCommit: "remote_apply", SynchronousStandbyNames: "s1", Standbys: 1, SyncStandbys: 1}, idem.DurabilitySynchronous},
		{"named, none confirming", idem.Durability{SynchronousCommit: "on", SynchronousStandbyNames: "s1", Standbys: 1}, idem.DurabilityAsynchronous},
		{"named, none connected: commits wait", idem.Durability{SynchronousCommit: "on", SynchronousStandbyNames: "s1"}, idem.DurabilitySynchronous},
		{"sync standby but commits do not wait", idem.Durability{SynchronousCommit: "local", SynchronousStandbyNames: "s1", Standbys: 1, SyncStandbys: 1}, idem.DurabilityAsynchronous},
		{"off", idem.Durability{SynchronousCommit: "off", SynchronousStandbyNames: "s1", Standbys: 1, SyncStandbys: 1}, idem.DurabilityAsynchronous},
		{"hidden", idem.Durability{SynchronousCommit: "on", SynchronousStandbyNames: "s1", Standbys: 1, Hidden: 1}, idem.DurabilityUnknown},
	} {
		require.Equal(t, tc.want, idem.ClassifyDurability(tc.in).Mode, tc.name)
	}
}
