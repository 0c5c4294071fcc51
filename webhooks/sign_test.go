package webhooks

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSignVector checks Sign against the example of the Standard Webhooks
// reference libraries (secret, id, timestamp and payload published there).
func TestSignVector(t *testing.T) {
	t.Parallel()
	sig, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
		time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	require.NoError(t, err)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", sig)
}
