package tenants_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/sqlite"
	"github.com/idem-dev/idem/tenants"
)

func openStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"), sqlite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func ptr[T any](v T) *T { return &v }

func TestCreateDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc := tenants.NewService(openStore(t), time.Minute)

	ten, err := svc.Create(ctx, "acme", "", idem.SettingsPatch{LeaseSecondsDefault: ptr(10)})
	require.NoError(t, err)
	want := idem.DefaultSettings()
	want.LeaseSecondsDefault = 10
	require.Equal(t, want, ten.Settings)
	require.Equal(t, "acme", ten.Name, "the name defaults to the id")

	_, err = svc.Create(ctx, "acme", "x", idem.SettingsPatch{})
	require.ErrorIs(t, err, idem.ErrTenantExists)

	for _, tc := range []struct {
		id, name string
		patch    idem.SettingsPatch
		field    string
	}{
		{"Bad", "", idem.SettingsPatch{}, "id"},
		{strings.Repeat("a", 65), "", idem.SettingsPatch{}, "id"},
		{"ok", strings.Repeat("n", 257), idem.SettingsPatch{}, "name"},
		{"ok", "", idem.SettingsPatch{ReplayWindowSeconds: ptr(0)}, "settings.replay_window_seconds"},
	} {
		_, err := svc.Create(ctx, tc.id, tc.name, tc.patch)
		var e *idem.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, idem.CodeInvalidRequest, e.Code)
		require.Equal(t, tc.field, e.Fields[0].Field)
	}
	list, err := svc.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

func TestActiveCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	svc := tenants.NewService(st, time.Hour)
	_, err := svc.Create(ctx, "acme", "Acme", idem.SettingsPatch{})
	require.NoError(t, err)

	_, err = svc.Active(ctx, "nobody")
	require.ErrorIs(t, err, idem.ErrTenantUnknown)

	ten, err := svc.Active(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 30, ten.Settings.LeaseSecondsDefault)

	// A change made elsewhere (another replica) is not seen until the TTL...
	other := tenants.NewService(st, time.Hour)
	_, err = other.Update(ctx, "acme", tenants.Patch{Settings: idem.SettingsPatch{LeaseSecondsDefault: ptr(7)}, Disabled: ptr(true)})
	require.NoError(t, err)
	ten, err = svc.Active(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 30, ten.Settings.LeaseSecondsDefault)

	// ...while this replica's own update or an explicit invalidation is seen
	// at once.
	svc.Invalidate("acme")
	_, err = svc.Active(ctx, "acme")
	require.ErrorIs(t, err, idem.ErrTenantUnknown)
	ten, err = svc.Update(ctx, "acme", tenants.Patch{Disabled: ptr(false), Name: ptr("Acme 2")})
	require.NoError(t, err)
	require.Equal(t, "Acme 2", ten.Name)
	require.Equal(t, 7, ten.Settings.LeaseSecondsDefault)
	ten, err = svc.Active(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 7, ten.Settings.LeaseSecondsDefault)

	// A zero TTL caches nothing.
	nocache := tenants.NewService(st, 0)
	_, err = other.Update(ctx, "acme", tenants.Patch{Settings: idem.SettingsPatch{LeaseSecondsDefault: ptr(8)}})
	require.NoError(t, err)
	ten, err = nocache.Active(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 8, ten.Settings.LeaseSecondsDefault)

	_, err = svc.Update(ctx, "acme", tenants.Patch{Settings: idem.SettingsPatch{LeaseSecondsMax: ptr(5)}})
	require.ErrorIs(t, err, idem.ErrInvalidRequest)
	_, err = svc.Update(ctx, "nobody", tenants.Patch{})
	require.ErrorIs(t, err, idem.ErrTenantNotFound)
}

func TestEnsure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc := tenants.NewService(openStore(t), tenants.DefaultCacheTTL)
	a, err := svc.Ensure(ctx, "demo", "Demo")
	require.NoError(t, err)
	b, err := svc.Ensure(ctx, "demo", "Other name")
	require.NoError(t, err)
	require.Equal(t, a.CreatedAt, b.CreatedAt)
	require.Equal(t, "Demo", b.Name)
}

func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	svc := tenants.NewService(st, time.Minute)
	require.NoError(t, st.Close())
	_, err := svc.Active(context.Background(), "acme")
	require.Equal(t, idem.CodeStoreUnavailable, idem.ErrorCode(err))
}

// The cached tenant carries its created_at, which the API compares with
// every tenant token's iat: a cache hit answers it without the store (the
// store is closed here), and deleting and creating the tenant again on
// this replica is seen at once.
func TestActiveCarriesCreatedAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	svc := tenants.NewService(st, time.Hour)
	created, err := svc.Create(ctx, "acme", "", idem.SettingsPatch{})
	require.NoError(t, err)
	require.False(t, created.CreatedAt.IsZero())
	ten, err := svc.Active(ctx, "acme")
	require.NoError(t, err)
	require.True(t, created.CreatedAt.Equal(ten.CreatedAt))

	require.NoError(t, svc.Delete(ctx, "acme"))
	again, err := svc.Create(ctx, "acme", "", idem.SettingsPatch{})
	require.NoError(t, err)
	require.True(t, again.CreatedAt.After(created.CreatedAt))
	ten, err = svc.Active(ctx, "acme")
	require.NoError(t, err)
	require.True(t, again.CreatedAt.Equal(ten.CreatedAt), "the new tenant's, not the cached old one's")

	require.NoError(t, st.Close())
	ten, err = svc.Known(ctx, "acme")
	require.NoError(t, err, "from the cache")
	require.True(t, again.CreatedAt.Equal(ten.CreatedAt))
}
