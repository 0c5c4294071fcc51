package webhooks

import (
	"os"
	"testing"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/stretchr/testify/require"
)

// TestCompleterSignatureVectors checks the shared completer signature
// vectors (testvectors/completer-signature.json) against Sign, the code
// that signs webhooks and completer calls: the Python and Node resume
// handlers verify the same vectors, so the three cannot drift apart.
func TestCompleterSignatureVectors(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../testvectors/completer-signature.json")
	require.NoError(t, err)
	var file struct {
		Description string `json:"description"`
		Version     int    `json:"version"`
		Vectors     []struct {
			Name      string `json:"name"`
			Secret    string `json:"secret"`
			ID        string `json:"id"`
			Timestamp int64  `json:"timestamp"`
			Body      string `json:"body"`
			Expect    struct {
				Signature string `json:"signature"`
			} `json:"expect"`
		} `json:"vectors"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	require.Equal(t, 1, file.Version)
	require.NotEmpty(t, file.Vectors)
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			sig, err := Sign(v.Secret, v.ID, time.Unix(v.Timestamp, 0), []byte(v.Body))
			require.NoError(t, err)
			require.Equal(t, v.Expect.Signature, sig)
		})
	}
}
