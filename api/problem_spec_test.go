package api

import (
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem"
)

// TestEveryProblemCodeIsInTheSpec keeps the one error mapping and
// openapi.yaml in step: every code the API can answer is in the Problem
// schema's enum, and the spec lists no code the API never sends.
func TestEveryProblemCodeIsInTheSpec(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(idem.OpenAPISpec)
	require.NoError(t, err)
	var specCodes []string
	for _, v := range doc.Components.Schemas["Problem"].Value.Properties["code"].Value.Enum {
		specCodes = append(specCodes, v.(string))
	}
	var apiCodes []string
	for code := range problems {
		apiCodes = append(apiCodes, string(code))
	}
	slices.Sort(specCodes)
	slices.Sort(apiCodes)
	require.Equal(t, apiCodes, specCodes)
}
