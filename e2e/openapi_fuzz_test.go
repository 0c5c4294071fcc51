package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// schemathesis returns the schemathesis command: $IDEM_SCHEMATHESIS, else
// the one on PATH. scripts/install-test-deps installs it (pinned, in a
// venv) and scripts/test sets IDEM_SCHEMATHESIS and
// IDEM_REQUIRE_SCHEMATHESIS=1, so under `make test` the test fails rather
// than skips when it is missing.
func schemathesis(t *testing.T) string {
	t.Helper()
	path := os.Getenv("IDEM_SCHEMATHESIS")
	if path == "" {
		path, _ = exec.LookPath("schemathesis")
	}
	if path == "" {
		if os.Getenv("IDEM_REQUIRE_SCHEMATHESIS") == "1" {
			t.Fatal("schemathesis is required (IDEM_REQUIRE_SCHEMATHESIS=1) but neither IDEM_SCHEMATHESIS nor PATH has it; run scripts/install-test-deps")
		}
		t.Skip("schemathesis not installed; run scripts/install-test-deps or set IDEM_SCHEMATHESIS")
	}
	return path
}

// openAPIFuzzExamples is schemathesis' --max-examples per operation;
// IDEM_OPENAPI_FUZZ_EXAMPLES overrides it for a longer local run.
func openAPIFuzzExamples() int {
	if n, err := strconv.Atoi(os.Getenv("IDEM_OPENAPI_FUZZ_EXAMPLES")); err == nil && n > 0 {
		return n
	}
	return 40
}

// openAPIFuzzChecks are schemathesis' checks: every one except
// positive_data_acceptance (a request valid against the schema may still be
// refused by state the schema cannot express: a key in flight, a lease above
// the tenant's maximum, a tenant that exists).
const openAPIFuzzChecks = "all"

// TestOpenAPIFuzz runs schemathesis, a property-based API fuzzer, against
// the real server binary on both stores, driven by the openapi.yaml the
// server serves: every operation gets the spec's examples, boundary values,
// generated valid and invalid inputs and stateful sequences along the
// spec's links (claim, then checkpoint/complete/fetch), a bounded number
// each. It fails on any 5xx and on any answer the spec does not describe
// (status code, content type, headers, body schema), on invalid input
// accepted, and on a 405 without Allow.
//
// Two passes, so that the operator endpoints (which may disable or delete
// any tenant, the fuzzer's own included) cannot starve the tenant ones: the
// tenant operations with a tenant token, then the /v1/admin operations
// with an operator token.
func TestOpenAPIFuzz(t *testing.T) {
	t.Parallel()
	cmdPath := schemathesis(t)
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			env := backendEnv(t, backend, nil)
			mustCLI(t, env, "migrate")
			// The spec allows leases up to 86400 s; so does this tenant, so
			// that generated leases are not all refused.
			mustCLI(t, env, "tenant", "create", "fuzz", "--lease-seconds-max", "86400")
			p := startServer(t, env)
			passes := []struct {
				name, token, filter string
			}{
				{"tenant", mintToken(t, env, "fuzz", "keys:write keys:read tenant:admin"), "--exclude-path-regex=^/v1/admin/"},
				{"operator", mintToken(t, env, "", "admin"), "--include-path-regex=^/v1/admin/"},
			}
			for _, pass := range passes {
				dir := t.TempDir()
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
				cmd := exec.CommandContext(ctx, cmdPath, "run", p.url+"/openapi.yaml",
					"--url", p.url,
					"--header", "Authorization: Bearer "+pass.token,
					pass.filter,
					"--checks", openAPIFuzzChecks,
					"--exclude-checks", "positive_data_acceptance",
					"--max-examples", strconv.Itoa(openAPIFuzzExamples()),
					"--seed", "9012",
					"--workers", "1",
					"--request-timeout", "30",
					"--generation-database", "none",
					"--suppress-health-check", "all",
					"--no-color",
					"--report", "junit", "--report-dir", dir,
				)
				cmd.Dir = dir
				out, err := cmd.CombinedOutput()
				cancel()
				t.Logf("schemathesis, %s pass against %s (%s):\n%s", pass.name, p.url, backend, tail(string(out), 20000))
				if err != nil {
					t.Errorf("schemathesis found failures in the %s pass on %s (%v); report in %s", pass.name, backend, err, filepath.Join(dir, "junit.xml"))
				}
			}
		})
	}
}
