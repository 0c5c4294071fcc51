package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
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

// TestPolyglotSDKCodesAreTheSpecs keeps the Python and Node SDKs' code lists
// identical to the spec's enum too, so a client in any language can name
// every code the server sends. The SDKs' own extras (unknown: an answer
// without a code; network: no answer) are not server codes.
func TestPolyglotSDKCodesAreTheSpecs(t *testing.T) {
	t.Parallel()
	for _, sdk := range []struct {
		file, start, end string
		line             *regexp.Regexp
		own              []string
	}{
		{"../clients/python/src/idem/_errors.py", "# The error codes", "\nclass ", regexp.MustCompile(`(?m)^[A-Z_]+ = "([a-z_]+)"$`), []string{"unknown"}},
		{"../clients/node/src/errors.ts", "export const Codes = {", "} as const;", regexp.MustCompile(`(?m)^\s+\w+: "([a-z_]+)",$`), []string{"unknown", "network", "invalid_answer"}},
	} {
		b, err := os.ReadFile(sdk.file)
		require.NoError(t, err)
		src := string(b)
		i := strings.Index(src, sdk.start)
		require.GreaterOrEqual(t, i, 0, "%s: no %q", sdk.file, sdk.start)
		src = src[i:]
		j := strings.Index(src, sdk.end)
		require.GreaterOrEqual(t, j, 0, "%s: no %q after %q", sdk.file, sdk.end, sdk.start)
		src = src[:j]
		var codes []string
		for _, m := range sdk.line.FindAllStringSubmatch(src, -1) {
			if !slices.Contains(sdk.own, m[1]) {
				codes = append(codes, m[1])
			}
		}
		slices.Sort(codes)
		require.Equal(t, problemCodesOfSpec(t), codes, sdk.file)
	}
}
