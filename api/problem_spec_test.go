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

// TestSDKCodesAreTheSpecs keeps the Go SDK's code list (client/errors.go;
// the SDK is its own module and imports nothing of the server) equal to
// the spec's enum, plus the SDK's own "unknown" for answers without a
// problem body. It reads the constants' values from the source, so the
// SDK needs no exported list for it: a constant is either errcode's code
// under the SDK's type (Code(errcode.X), its value read from
// client/errcode/errcode.go) or the SDK's own literal.
func TestSDKCodesAreTheSpecs(t *testing.T) {
	t.Parallel()
	errcodes := map[string]string{}
	for _, vs := range constSpecs(t, "../client/errcode/errcode.go") {
		if lit, ok := codeLiteral(t, vs); ok {
			errcodes[vs.Names[0].Name] = lit
		}
	}
	var sdkCodes []string
	for _, vs := range constSpecs(t, "../client/errors.go") {
		code, ok := codeLiteral(t, vs)
		if !ok {
			for _, v := range vs.Values {
				call, isCall := v.(*ast.CallExpr)
				if !isCall || !isIdent(call.Fun, "Code") {
					continue
				}
				require.Len(t, call.Args, 1)
				sel, isSel := call.Args[0].(*ast.SelectorExpr)
				require.True(t, isSel && isIdent(sel.X, "errcode"), "client code constants are string literals or Code(errcode.X)")
				code, ok = errcodes[sel.Sel.Name]
				require.True(t, ok, "errcode.%s is no code of errcode.go", sel.Sel.Name)
			}
		}
		if ok && code != "unknown" {
			sdkCodes = append(sdkCodes, code)
		}
	}
	slices.Sort(sdkCodes)
	require.Equal(t, problemCodesOfSpec(t), sdkCodes)
}

// constSpecs returns the specs of the const declarations of a Go file.
func constSpecs(t *testing.T, file string) []*ast.ValueSpec {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	require.NoError(t, err)
	var specs []*ast.ValueSpec
	for _, decl := range f.Decls {
		if gen, ok := decl.(*ast.GenDecl); ok && gen.Tok == token.CONST {
			for _, spec := range gen.Specs {
				specs = append(specs, spec.(*ast.ValueSpec))
			}
		}
	}
	return specs
}

// codeLiteral returns the value of a constant written `Name Code =
// "literal"`, and whether it is one.
func codeLiteral(t *testing.T, vs *ast.ValueSpec) (string, bool) {
	t.Helper()
	if !isIdent(vs.Type, "Code") {
		return "", false
	}
	require.Len(t, vs.Values, 1)
	lit, ok := vs.Values[0].(*ast.BasicLit)
	require.True(t, ok, "a Code constant of a type is a string literal")
	code, err := strconv.Unquote(lit.Value)
	require.NoError(t, err)
	return code, true
}

// isIdent reports whether e is the identifier name.
func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
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
