package idem_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestClaimQuota: a claim is checked against the quota once the tenant's
// usage as read has reached nine tenths of it, and not below.
func TestClaimQuota(t *testing.T) {
	t.Parallel()
	ten := idem.Tenant{Settings: idem.DefaultSettings()}
	ten.Settings.StorageQuotaBytes = 1000
	for _, tc := range []struct {
		used, want int64
	}{
		{0, 0}, {899, 0}, {900, 1000}, {999, 1000}, {1000, 1000}, {5000, 1000},
	} {
		ten.StoredBytes = tc.used
		require.Equal(t, tc.want, ten.ClaimQuota(), "usage %d", tc.used)
	}
}
