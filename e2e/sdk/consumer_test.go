package sdk_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// serverModules are module paths of the server's dependencies; a program
// that uses only the SDK must resolve none of them.
var serverModules = []string{
	"github.com/idem-dev/idem ", // the root module itself (the space ends the path)
	"modernc.org/",
	"github.com/jackc/",
	"github.com/go-chi/",
	"github.com/prometheus/",
	"github.com/golang-jwt/",
	"github.com/pressly/",
	"github.com/getkin/",
}

// TestSDKConsumerResolvesNoServerDependency builds a throwaway module that
// requires only the Go SDK (through a replace to ./client, as a user's
// `go get github.com/idem-dev/idem/client` would fetch it), runs `go mod
// tidy` and checks that neither its go.sum nor its package graph holds
// anything of the server: the SDK is its own module, standard library only.
func TestSDKConsumerResolvesNoServerDependency(t *testing.T) {
	t.Parallel()
	clientDir, err := filepath.Abs(filepath.Join("..", "..", "client"))
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600))
	}
	write("go.mod", "module example.com/consumer\n\ngo 1.26.0\n\n"+
		"require github.com/idem-dev/idem/client v0.0.0\n\n"+
		"replace github.com/idem-dev/idem/client => "+clientDir+"\n")
	write("main.go", `package main

import (
	"fmt"

	"github.com/idem-dev/idem/client"
	_ "github.com/idem-dev/idem/client/frontdoor"
	_ "github.com/idem-dev/idem/client/idemhttp"
)

func main() { fmt.Println(client.CodeLeaseLost) }
`)
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// The CI's GOFLAGS=-mod=readonly would forbid the tidy; a go.work
		// above the temp folder must not change what resolves.
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	gocmd("mod", "tidy")
	deps := gocmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./...")
	modules := gocmd("list", "-m", "all")
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if os.IsNotExist(err) {
		sum, err = nil, nil // nothing to check: no module besides the SDK
	}
	require.NoError(t, err)
	require.Contains(t, deps, "github.com/idem-dev/idem/client/idemhttp\n")
	for _, m := range serverModules {
		require.NotContains(t, string(sum)+"\n", m, "go.sum of an SDK-only consumer")
		require.NotContains(t, modules+"\n", m, "go list -m all of an SDK-only consumer")
		require.NotContains(t, strings.ReplaceAll(deps, "\n", " \n"), m, "packages of an SDK-only consumer")
	}
	for _, pkg := range strings.Fields(deps) {
		require.True(t, strings.HasPrefix(pkg, "github.com/idem-dev/idem/client") || pkg == "example.com/consumer",
			"an SDK-only consumer builds %s, which is not the standard library", pkg)
	}
}
