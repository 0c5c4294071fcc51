package keyevents_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keyevents"
)

func TestBroadcast(t *testing.T) {
	t.Parallel()
	var b keyevents.Broadcast
	a1 := b.Subscribe("acme", "k")
	a2 := b.Subscribe("acme", "k")
	other := b.Subscribe("beta", "k")
	require.Equal(t, 3, b.Len())
	b.Publish("acme", "k")
	b.Publish("acme", "k") // coalesced: one pending signal
	for _, s := range []*idem.Subscription{a1, a2} {
		<-s.C
		select {
		case <-s.C:
			t.Fatal("signals must coalesce")
		default:
		}
	}
	select {
	case <-other.C:
		t.Fatal("another tenant's key was signalled")
	default:
	}
	a1.Close()
	a1.Close()
	require.Equal(t, 2, b.Len())
	b.PublishTenant("beta")
	<-other.C
	b.PublishAll()
	<-a2.C
	<-other.C
	select {
	case <-a1.C:
		t.Fatal("a closed subscription was signalled")
	default:
	}
}
