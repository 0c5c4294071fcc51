package idem_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// layerOf places a package of either module on the floors the README
// ("Where things live") describes: the SDK module at the
// bottom (the server imports its rules, never the reverse), the domain
// root above it, then what the stores build on, the stores, the HTTP
// front ends and jobs, the composition root and the commands. Floor -1 is
// the test and bench side (testkit/, storetest/, testvectors/, e2e/,
// deploy/'s checks), which may import anything and which product code
// never imports.
//
// A package whose folder is not listed fails the test: a new top-level
// folder is placed here on purpose, not by default.
func layerOf(pkg string) (int, bool) {
	if pkg == "." {
		return 1, true
	}
	top, _, _ := strings.Cut(pkg, "/")
	switch top {
	case "client":
		return 0, true
	case "canon", "storemw", "keyevents", "eventpayload", "metrics", "retrybudget", "internal", "tenants", "auth", "db", "web", "conformance":
		return 2, true
	case "postgres", "sqlite":
		return 3, true
	case "api", "jobs", "webhooks", "gateway":
		return 4, true
	case "server":
		return 5, true
	case "cmd":
		return 6, true
	case "testkit", "storetest", "testvectors", "e2e", "deploy":
		return -1, true
	}
	return 0, false
}

// benchTools may import the test kit: they are load tools run by
// scripts/bench-*, never built into the binary (the Dockerfile builds
// ./cmd/server only).
var benchTools = []string{"cmd/loadgen"}

// goImports lists, for each package of the module in dir, the packages of
// this repository its non-test files import, paths relative to the
// repository root ("." for the root package).
func goImports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	const mod = "github.com/idem-dev/idem"
	rel := func(p string) string {
		if p == mod {
			return "."
		}
		return strings.TrimPrefix(p, mod+"/")
	}
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr.String())
	}
	g := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		var deps []string
		for _, imp := range fields[1:] {
			if imp == mod || strings.HasPrefix(imp, mod+"/") {
				deps = append(deps, rel(imp))
			}
		}
		g[rel(fields[0])] = deps
	}
	return g
}

// TestLayers checks issue 22's first rule on the Go side: no import runs
// from a lower floor to a higher one (layerOf), product code never imports
// the test kit, and the SDK module imports nothing of the server module.
// Import circles inside a module the compiler refuses already; the SDK
// rule keeps the two modules from forming one between them.
func TestLayers(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the layering check needs the go command: %v", err)
	}
	g := goImports(t, ".")
	sdk := goImports(t, "client")
	for pkg, deps := range sdk {
		for _, d := range deps {
			if !strings.HasPrefix(d, "client") {
				t.Errorf("SDK package %s imports the server module's %s", pkg, d)
			}
		}
		g[pkg] = deps
	}
	var up []string
	for pkg, deps := range g {
		from, ok := layerOf(pkg)
		if !ok {
			t.Errorf("package %s is in a folder TestLayers does not place: add it to layerOf", pkg)
			continue
		}
		for _, d := range deps {
			to, ok := layerOf(d)
			switch {
			case !ok:
				t.Errorf("package %s imports %s, in a folder TestLayers does not place", pkg, d)
			case from == -1:
			case to == -1 && !slices.Contains(benchTools, pkg):
				up = append(up, fmt.Sprintf("%s -> %s (product code imports the test kit)", pkg, d))
			case to > from:
				up = append(up, fmt.Sprintf("%s (floor %d) -> %s (floor %d)", pkg, from, d, to))
			}
		}
	}
	slices.Sort(up)
	for _, u := range up {
		t.Errorf("upward import: %s", u)
	}
	if len(g) < 40 {
		t.Fatalf("go list found %d packages: not the repository (run from its root)", len(g))
	}
}
