package web_test

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/testkit/servertest"
)

// readmes are the READMEs a newcomer reads first, relative to this
// package. Every fenced code block in them is accounted for by
// TestReadmeSnippets: run as shown, or the same bytes as an example file
// that a test runs, or exempt for a reason given here.
var readmes = []string{"../README.md", "../clients/python/README.md", "../clients/node/README.md"}

// snippet is one fenced code block of a README.
type snippet struct {
	file, lang, text string
	line             int
}

var fence = regexp.MustCompile("(?m)^```([a-z]*)\n")

// snippetsOf returns the fenced code blocks of a Markdown file.
func snippetsOf(t *testing.T, file string) []snippet {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	src := string(b)
	var out []snippet
	for {
		m := fence.FindStringSubmatchIndex(src)
		if m == nil {
			return out
		}
		lang := src[m[2]:m[3]]
		rest := src[m[1]:]
		end := strings.Index(rest, "\n```")
		require.GreaterOrEqual(t, end, 0, "%s: an unclosed code block", file)
		line := strings.Count(string(b[:len(b)-len(src)+m[0]]), "\n") + 1
		out = append(out, snippet{file: file, lang: lang, text: rest[:end+1], line: line})
		src = rest[end+4:]
	}
}

// snippetRun says how one README block is proven: by the first line it
// starts with.
type snippetRun struct {
	starts string
	// example, when set, is the file under docs/examples the block is,
	// byte for byte: a program block is a complete file (imports
	// included), so what the README shows is what CI runs.
	example string
	// run runs the block as it is shown against the test's live server;
	// nil with a reason means exempt, or run by the test the reason names.
	run    func(t *testing.T, live *liveServer, s snippet)
	reason string
}

// programLangs are the languages of program blocks: each must be an
// example file (snippetRun.example).
var programLangs = map[string]bool{"python": true, "py": true, "js": true, "javascript": true, "ts": true, "typescript": true, "go": true}

var readmeSnippets = map[string][]snippetRun{
	"../README.md": {
		{starts: "make run", reason: "the README's two commands: CI runs `make test` itself, and e2e TestSQLiteDevModeCreatesItsFile starts the development-mode server `make run` starts"},
		{starts: "# 1. claim the key", run: runCurlQuickstart},
		{starts: "export IDEM_JWT_HS256_SECRET", reason: "Docker Compose: no image can be pulled on this machine; deploy's tests validate the compose, Prometheus and Alertmanager configurations"},
		{starts: "docker compose", reason: "Docker Compose, as above"},
	},
	"../clients/python/README.md": {
		{starts: "pip install ./clients/python", run: runPipInstall},
		{starts: "import os\n\nfrom idem import Claim, Client", example: "readme/python_run.py", run: runPythonRun},
		{starts: "# FastAPI behind idem", example: "frameworks/fastapi_app.py", reason: frameworkExampleRun},
		{starts: "# A resume endpoint for idem's completer", example: "readme/python_resume.py", run: runPythonResume},
	},
	"../clients/node/README.md": {
		{starts: "npm install --install-links ./clients/node", run: runNpmInstall},
		{starts: "import { Client, NoSideEffect, key }", example: "readme/node_run.mjs", run: runNodeRun},
		{starts: "// Express behind idem", example: "readme/node_express.mjs", run: runNodeExpress},
		{starts: "// Next.js route handler", example: "readme/node_next_route.js", run: runNextRoute},
		{starts: "// Hono on Node.js behind idem", example: "readme/node_hono.mjs", run: runNodeHono},
		{starts: "// A resume endpoint for idem's completer", example: "readme/node_resume.mjs", run: runNodeResume},
	},
}

// frameworkExampleRun is the reason of a README block that is one of the
// Frameworks page's apps: TestFrameworkExamples runs it (checked below).
const frameworkExampleRun = "a Frameworks page app: TestFrameworkExamples runs it as shown and tries a duplicate"

// liveServer is the one idem server of TestReadmeSnippets, seen by one
// block: each block has a tenant of its own, so that blocks using the same
// key (the Python and Node `run` examples derive the same one) do not see
// each other.
type liveServer struct {
	url, token string
}

// TestReadmeSnippets checks that every code block of the READMEs runs as
// it is shown (or says why it cannot run here), so that a newcomer who
// pastes one gets what the README promises. A program block must be the
// exact bytes of an example file: the README cannot drift from what runs.
func TestReadmeSnippets(t *testing.T) {
	t.Parallel()
	type job struct {
		name string
		r    snippetRun
		s    snippet
	}
	var jobs []job
	for _, file := range readmes {
		runs := readmeSnippets[file]
		used := map[int]bool{}
		for _, s := range snippetsOf(t, file) {
			i := -1
			for j, r := range runs {
				if strings.HasPrefix(strings.TrimSpace(s.text), r.starts) {
					i = j
					break
				}
			}
			require.GreaterOrEqual(t, i, 0, "%s:%d: a code block no test runs (add it to readmeSnippets):\n%s", s.file, s.line, s.text)
			require.False(t, used[i], "%s:%d: a second code block starts with %q: give it an entry of its own", s.file, s.line, runs[i].starts)
			used[i] = true
			r := runs[i]
			if programLangs[s.lang] || r.example != "" {
				require.NotEmpty(t, r.example, "%s:%d: a %s block must be a complete example file under %s", s.file, s.line, s.lang, examplesDir)
				want, err := os.ReadFile(filepath.Join(examplesDir, r.example))
				require.NoError(t, err)
				require.Equal(t, string(want), s.text, "%s:%d: the block is not %s byte for byte: copy the file into the README (CI runs the file)", s.file, s.line, r.example)
			}
			if r.run == nil {
				require.NotEmpty(t, r.reason)
				if r.reason == frameworkExampleRun {
					requireFrameworkExample(t, r.example)
				}
				continue
			}
			name := strings.SplitN(r.starts, "\n", 2)[0]
			if r.example != "" {
				name = r.example
			}
			name = strings.TrimPrefix(file, "../") + ":" + name
			jobs = append(jobs, job{name, r, s})
		}
		for j, r := range runs {
			require.True(t, used[j], "%s: no code block starts with %q any more: update readmeSnippets", file, r.starts)
		}
	}
	var tenants []string
	for i := range jobs {
		tenants = append(tenants, "readme-"+strconv.Itoa(i+1))
	}
	srv := servertest.Start(t, servertest.Options{Tenants: tenants})
	for i, j := range jobs {
		t.Run(j.name, func(t *testing.T) {
			t.Parallel()
			j.r.run(t, &liveServer{url: srv.URL(), token: srv.Token(t, tenants[i], "keys:write")}, j.s)
		})
	}
}

// requireFrameworkExample checks that TestFrameworkExamples runs example.
func requireFrameworkExample(t *testing.T, example string) {
	t.Helper()
	src, err := os.ReadFile("frameworks_test.go")
	require.NoError(t, err)
	require.Contains(t, string(src), strconv.Quote(example), "TestFrameworkExamples does not run %s", example)
}

// runCurlQuickstart runs the README's curl quickstart with bash, as pasted
// after the server's export lines, against a live server: the claim is
// 201, the complete stores the answer, and the retry is the replay.
func runCurlQuickstart(t *testing.T, live *liveServer, s snippet) {
	interpreter(t, "curl")
	file := filepath.Join(t.TempDir(), "quickstart.sh")
	require.NoError(t, os.WriteFile(file, []byte("set -euo pipefail\n"+s.text), 0o644))
	out := runExample(t, live.url, live.token, "", interpreter(t, "bash"), file)
	require.Contains(t, out, `"state":"in_flight"`, "the claim")
	require.Contains(t, out, `"state":"completed"`, "the complete")
	require.Regexp(t, `(?i)HTTP/1\.1 200 OK[\s\S]*Idempotent-Replayed: true`, out, "the retry is a replay")
	require.Contains(t, out, `\"id\":\"ord_1\"`, "the replay carries the stored body")
}

// copyTree copies the files and folders names of the folder from into to.
func copyTree(t *testing.T, from, to string, names ...string) {
	t.Helper()
	for _, name := range names {
		require.NoError(t, os.CopyFS(filepath.Join(to, name), os.DirFS(filepath.Join(from, name))), name)
	}
}

// copyFiles copies the files names of the folder from into to.
func copyFiles(t *testing.T, from, to string, names ...string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(to, 0o755))
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(from, name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(to, name), b, 0o644))
	}
}

// runShell runs a README's sh block with bash in dir, env added, and
// returns its output.
func runShell(t *testing.T, dir string, s snippet, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, interpreter(t, "bash"), "-euo", "pipefail", "-c", s.text)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", strings.TrimSpace(s.text), out)
	require.NoError(t, err, "%s:%d failed:\n%s", s.file, s.line, out)
	return string(out)
}

// runPipInstall runs `pip install ./clients/python` as shown, in a folder
// that holds a copy of the package's source (so the build leaves nothing in
// the checkout), with the pip of .venv (scripts/install-test-deps) told by
// its environment to install into a folder of its own, offline and without
// the dependencies (httpx is in .venv). The installed package imports,
// middleware modules included, from there.
func runPipInstall(t *testing.T, _ *liveServer, s snippet) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	venvBin := filepath.Join(root, ".venv", "bin")
	if _, err := os.Stat(filepath.Join(venvBin, "pip")); err != nil {
		if os.Getenv("IDEM_REQUIRE_EXAMPLES") == "1" {
			t.Fatalf("%s/pip not found but IDEM_REQUIRE_EXAMPLES=1: run scripts/install-test-deps", venvBin)
		}
		t.Skipf("%s/pip not found (run scripts/install-test-deps)", venvBin)
	}
	dir := t.TempDir()
	pkg := filepath.Join(dir, "clients", "python")
	copyFiles(t, filepath.Join(root, "clients", "python"), pkg, "pyproject.toml", "README.md")
	copyTree(t, filepath.Join(root, "clients", "python"), pkg, "src")
	site := filepath.Join(dir, "site")
	runShell(t, dir, s, "PATH="+venvBin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"PIP_TARGET="+site, "PIP_NO_DEPS=1", "PIP_NO_INDEX=1", "PIP_NO_BUILD_ISOLATION=0",
		"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_QUIET=1", "PIP_NO_CACHE_DIR=1")
	out := runExample(t, "", "", "", filepath.Join(venvBin, "python"), "-I", "-c",
		"import sys; sys.path.insert(0, "+strconv.Quote(site)+"); import idem, idem.asgi, idem.wsgi; print(idem.__file__)")
	require.Equal(t, filepath.Join(site, "idem", "__init__.py"), strings.TrimSpace(out), "the package imports from where pip installed it")
}

// runNpmInstall runs `npm install --install-links ./clients/node` as
// shown, in a new project next to a copy of the package's folder as a
// checkout has it (package.json, README.md, dist; no node_modules),
// offline: the package has no runtime dependency. The package is installed
// as a copy whose entry point imports, and nothing is installed into the
// package's folder (without --install-links npm links the folder and
// installs the SDK's devDependencies there, from the registry).
func runNpmInstall(t *testing.T, _ *liveServer, s snippet) {
	node := interpreter(t, "node")
	interpreter(t, "npm")
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	pkg := filepath.Join(dir, "clients", "node")
	copyFiles(t, filepath.Join(root, "clients", "node"), pkg, "package.json", "README.md")
	copyTree(t, filepath.Join(root, "clients", "node"), pkg, "dist")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"consumer","private":true,"type":"module"}`), 0o644))
	runShell(t, dir, s, "npm_config_offline=true", "npm_config_audit=false", "npm_config_fund=false",
		"npm_config_update_notifier=false", "npm_config_loglevel=error", "npm_config_cache="+filepath.Join(dir, ".npm"))
	check := filepath.Join(dir, "check.mjs")
	require.NoError(t, os.WriteFile(check, []byte(`import { Client, expressMiddleware, withIdempotency } from "@idem-dev/idem";
import { createRequire } from "node:module";
for (const f of [Client, expressMiddleware, withIdempotency]) if (typeof f !== "function") throw new Error("not exported");
console.log(createRequire(import.meta.url).resolve("@idem-dev/idem"));
`), 0o644))
	out := runExample(t, "", "", "", node, check)
	installed := filepath.Join(dir, "node_modules", "@idem-dev", "idem")
	require.Equal(t, filepath.Join(installed, "dist", "index.js"), strings.TrimSpace(out), "the package resolves to the installed copy")
	st, err := os.Lstat(installed)
	require.NoError(t, err)
	require.True(t, st.IsDir(), "a copy, not a link to the checkout (whose devDependencies npm would install)")
	_, err = os.Stat(filepath.Join(pkg, "node_modules"))
	require.ErrorIs(t, err, fs.ErrNotExist, "npm installed nothing into the package's folder")
	pj, err := os.ReadFile(filepath.Join(dir, "package.json"))
	require.NoError(t, err)
	var manifest struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	require.NoError(t, json.Unmarshal(pj, &manifest))
	require.Equal(t, map[string]string{"@idem-dev/idem": "file:clients/node"}, manifest.Dependencies, "npm install records the dependency")
}

// runLines runs one example file against the live server and returns its
// output lines.
func runLines(t *testing.T, live *liveServer, argv []string) []string {
	t.Helper()
	return strings.Split(strings.TrimSpace(runExample(t, live.url, live.token, "", argv...)), "\n")
}

// requireKeyCompleted asserts through the API that key is completed with a
// stored 201.
func requireKeyCompleted(t *testing.T, live *liveServer, key string) {
	t.Helper()
	req, err := http.NewRequest("GET", live.url+"/v1/keys/"+url.PathEscape(key), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+live.token)
	resp, err := apiClient(t).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var rec struct {
		State    string `json:"state"`
		Response struct {
			Status int `json:"status"`
		} `json:"response"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rec))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "completed", rec.State)
	require.Equal(t, 201, rec.Response.Status)
}

var runLine = regexp.MustCompile(`^run (\d) of (\S+): replayed=(\S+) status=201 (?:body=\{"ok":true\} )?charges=1$`)

// requireRunThenReplay checks the output of a README `run` example: the
// first run ran the function (one charge), the second with the same key is
// the replay (still one charge), and the key is completed in idem.
func requireRunThenReplay(t *testing.T, live *liveServer, lines []string) {
	t.Helper()
	require.Len(t, lines, 2, "two runs")
	var key string
	for i, want := range []string{"(?i)false", "(?i)true"} {
		m := runLine.FindStringSubmatch(lines[i])
		require.NotNil(t, m, "run %d: %q", i+1, lines[i])
		require.Regexp(t, want, m[3], "run %d: replayed", i+1)
		require.NotEmpty(t, m[2])
		if key != "" {
			require.Equal(t, key, m[2], "both runs use the same key")
		}
		key = m[2]
	}
	requireKeyCompleted(t, live, key)
}

// runPythonRun runs the Python README's `run` example.
func runPythonRun(t *testing.T, live *liveServer, _ snippet) {
	requireRunThenReplay(t, live, runLines(t, live, pythonSDK("readme/python_run.py")(t)))
}

// runNodeRun runs the Node README's `run` example.
func runNodeRun(t *testing.T, live *liveServer, _ snippet) {
	project := nodeProject(t, map[string]string{"run.mjs": "readme/node_run.mjs"})
	requireRunThenReplay(t, live, runLines(t, live, []string{interpreter(t, "node"), filepath.Join(project, "run.mjs")}))
}

// nodeProject makes a project folder as `npm install --install-links ./clients/node` and
// `npm install <packages>` would: node_modules/@idem-dev/idem links to
// clients/node, each package to the SDK's own dev dependency, and files
// (path in the project → example file) are copied in. It returns the
// project's folder.
func nodeProject(t *testing.T, files map[string]string, packages ...string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	project := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name":"app","private":true,"type":"module"}`), 0o644))
	for _, p := range append([]string{"@idem-dev/idem"}, packages...) {
		target := filepath.Join(root, "clients", "node", "node_modules", p)
		if p == "@idem-dev/idem" {
			target = filepath.Join(root, "clients", "node")
		}
		_, err := os.Stat(target)
		require.NoError(t, err, "run npm ci in clients/node")
		link := filepath.Join(project, "node_modules", p)
		require.NoError(t, os.MkdirAll(filepath.Dir(link), 0o755))
		require.NoError(t, os.Symlink(target, link))
	}
	for dst, example := range files {
		src, err := os.ReadFile(filepath.Join(examplesDir, example))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(project, dst)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(project, dst), src, 0o644))
	}
	return project
}

// payment is one request of a duplicate test: its answer.
type payment struct {
	status   int
	replayed string
	body     string
}

// pay POSTs a JSON body with an Idempotency-Key (and headers) to u.
func pay(t *testing.T, u, key, body string, headers ...string) payment {
	t.Helper()
	req, err := http.NewRequest("POST", u, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return payment{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)}
}

// startNodeApp starts a README app in its project and waits for it to
// listen; it returns its base URL and output.
func startNodeApp(t *testing.T, live *liveServer, project, file string) (string, *lockedBuffer) {
	t.Helper()
	port := freePort(t)
	out := startApp(t, []string{interpreter(t, "node"), filepath.Join(project, file)},
		"IDEM_URL="+live.url, "IDEM_TOKEN="+live.token, "PORT="+strconv.Itoa(port))
	waitListening(t, port, out)
	return "http://127.0.0.1:" + strconv.Itoa(port), out
}

// runNodeExpress runs the Node README's Express app: a payment runs the
// handler once, its duplicate (same key, same account) is the stored
// answer, and the same key from another account (the scope) is another
// payment.
func runNodeExpress(t *testing.T, live *liveServer, _ snippet) {
	project := nodeProject(t, map[string]string{"app.mjs": "readme/node_express.mjs"}, "express")
	base, out := startNodeApp(t, live, project, "app.mjs")
	first := pay(t, base+"/payments", "pay-1", `{"amount": 1000}`, "X-Account-Id", "acct_a")
	require.Equal(t, payment{201, "", `{"charge":"ch_1","amount":1000}`}, first, out.String())
	dup := pay(t, base+"/payments", "pay-1", `{"amount": 1000}`, "X-Account-Id", "acct_a")
	require.Equal(t, payment{201, "true", first.body}, dup, "the duplicate is the stored answer")
	other := pay(t, base+"/payments", "pay-1", `{"amount": 1000}`, "X-Account-Id", "acct_b")
	require.Equal(t, payment{201, "", `{"charge":"ch_2","amount":1000}`}, other, "another account's key is its own")
	require.Equal(t, 2, strings.Count(out.String(), "charged 1000"), "one side effect per key and account:\n%s", out.String())
}

// runNodeHono runs the Node README's Hono app: one side effect per key,
// the duplicate replayed, and a key reused on another payment's path is
// 422 (the path is fingerprinted), the handler not run.
func runNodeHono(t *testing.T, live *liveServer, _ snippet) {
	project := nodeProject(t, map[string]string{"app.mjs": "readme/node_hono.mjs"}, "hono", "@hono/node-server")
	base, out := startNodeApp(t, live, project, "app.mjs")
	first := pay(t, base+"/payments/p7", "pay-1", `{"amount": 1000}`)
	require.Equal(t, payment{201, "", `{"charge":"ch_1","id":"p7","amount":1000}`}, first, out.String())
	dup := pay(t, base+"/payments/p7", "pay-1", `{"amount": 1000}`)
	require.Equal(t, payment{201, "true", first.body}, dup, "the duplicate is the stored answer")
	other := pay(t, base+"/payments/p8", "pay-1", `{"amount": 1000}`)
	require.Equal(t, 422, other.status, other.body)
	require.Contains(t, other.body, "fingerprint_mismatch")
	require.Equal(t, 1, strings.Count(out.String(), "charged 1000"), "one side effect:\n%s", out.String())
}

// nextDriver calls the route file's POST as Next.js does, with a real
// Request (Next.js passes a NextRequest, a Request subclass, and a context
// the wrapper hands on to the handler), twice with one key.
const nextDriver = `import { POST } from "./app/payments/route.js";
for (let i = 0; i < 2; i++) {
  const req = new Request("http://127.0.0.1:3000/payments", { method: "POST", body: JSON.stringify({ amount: 1000 }),
    headers: { "Content-Type": "application/json", "Idempotency-Key": "pay-1" } });
  const res = await POST(req, { params: Promise.resolve({}) });
  console.log(JSON.stringify({ status: res.status, replayed: res.headers.get("Idempotent-Replayed"), body: await res.text() }));
}
`

// runNextRoute runs the Node README's Next.js route file: next cannot be
// installed here, so a driver imports app/payments/route.js and calls its
// exported POST as Next.js does. The first call runs the handler, the
// second is the stored answer, one side effect.
func runNextRoute(t *testing.T, live *liveServer, _ snippet) {
	project := nodeProject(t, map[string]string{"app/payments/route.js": "readme/node_next_route.js"})
	require.NoError(t, os.WriteFile(filepath.Join(project, "drive.mjs"), []byte(nextDriver), 0o644))
	lines := runLines(t, live, []string{interpreter(t, "node"), filepath.Join(project, "drive.mjs")})
	require.Equal(t, []string{
		`charged 1000 (charge 1)`,
		`{"status":201,"replayed":null,"body":"{\"charge\":\"ch_1\",\"amount\":1000}"}`,
		`{"status":201,"replayed":"true","body":"{\"charge\":\"ch_1\",\"amount\":1000}"}`,
	}, lines)
}

// TestRecoveryPointsExample runs the keys page's worked example
// (docs/examples/recovery_points.py, shown by docs/keys/ as it is) against
// a live server: worker A crashes after its charge, worker B takes the key
// over and resumes after "charged" (one order, one charge, one email), A's
// late write with its old token is refused by the fenced UPDATE and its
// complete by idem, and the retry is the replay.
func TestRecoveryPointsExample(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"docs"}})
	token := srv.Token(t, "docs", "keys:write")
	out := runExample(t, srv.URL(), token, "order-confirm-4711-recovery", pythonSDK("recovery_points.py")(t)...)
	require.Equal(t, []string{
		"token 1: resumed=False recovery_point=None",
		"token 2: resumed=True recovery_point=charged",
		`worker B: {"order_id": "ord_4711", "charge_id": "ch_1"}`,
		"worker A's late write: refused",
		"worker A's complete: 409 lease_lost",
		`retry: {"order_id": "ord_4711", "charge_id": "ch_1"} charges=1 emails=1`,
	}, strings.Split(strings.TrimSpace(out), "\n"))
	live := &liveServer{url: srv.URL(), token: token}
	requireKeyCompleted(t, live, "order-confirm-4711-recovery")
}
