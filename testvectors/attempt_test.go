package testvectors_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client/frontdoor"
	"github.com/idem-dev/idem/retrybudget"
)

// TestAttemptVectorsMatchTheServer: every Idem-Attempt vector of
// policy.json (rule 9) is read by the idem server's own parser
// (retrybudget.ParseAttempt, github.com/dunglas/httpsfv) as the vector
// says, and so is what the front door passes on: the front doors'
// parsers, which the vectors pin down in every language, cannot count a
// caller's retry differently from idem.
func TestAttemptVectorsMatchTheServer(t *testing.T) {
	b, err := os.ReadFile("frontdoor/policy.json")
	require.NoError(t, err)
	var file struct {
		Attempts []struct {
			Name   string   `json:"name"`
			Fields []string `json:"fields"`
			Expect struct {
				Number  int64   `json:"number"`
				Forward *string `json:"forward"`
			} `json:"expect"`
		} `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal(b, &file))
	require.NotEmpty(t, file.Attempts)
	for _, v := range file.Attempts {
		got := retrybudget.ParseAttempt(v.Fields)
		assert.Equal(t, v.Expect.Number, got.Number, v.Name)
		assert.Equal(t, v.Expect.Forward != nil, got.Retry(), v.Name)
		assert.Equal(t, v.Expect.Number, int64(frontdoor.CallerAttempt(v.Fields).Number), v.Name)
		if v.Expect.Forward != nil {
			fwd := retrybudget.ParseAttempt([]string{*v.Expect.Forward})
			assert.Equal(t, got, fwd, "%s: what is passed on reads as what came", v.Name)
		}
	}
}
