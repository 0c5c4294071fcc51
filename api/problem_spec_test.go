package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
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
	specCodes := problemCodesOfSpec(t)
	var apiCodes []string
	for code := range problems {
		apiCodes = append(apiCodes, string(code))
	}
	slices.Sort(apiCodes)
	require.Equal(t, apiCodes, specCodes)
}

// TestSDKCodesAreTheSpecs keeps the Go SDK's copy of the code list
// (client/errors.go; the SDK is its own module and imports nothing of the
// server) equal to the spec's enum, plus the SDK's own "unknown" for
// answers without a problem body. It reads the constants from the source,
// so the SDK needs no exported list for it.
func TestSDKCodesAreTheSpecs(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "../client/errors.go", nil, 0)
	require.NoError(t, err)
	var sdkCodes []string
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				require.True(t, ok, "client code constants are string literals")
				code, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				if code != "unknown" {
					sdkCodes = append(sdkCodes, code)
				}
			}
		}
	}
	slices.Sort(sdkCodes)
	require.Equal(t, problemCodesOfSpec(t), sdkCodes)
}

// problemCodesOfSpec returns the Problem schema's code enum, sorted.
func problemCodesOfSpec(t *testing.T) []string {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(idem.OpenAPISpec)
	require.NoError(t, err)
	var codes []string
	for _, v := range doc.Components.Schemas["Problem"].Value.Properties["code"].Value.Enum {
		codes = append(codes, v.(string))
	}
	slices.Sort(codes)
	return codes
}
