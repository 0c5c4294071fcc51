package web_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/server/servertest"
)

// readmes are the READMEs a newcomer reads first, relative to this
// package. Every fenced code block in them is accounted for by
// TestReadmeSnippets: run as shown, or the same bytes as an example file
// that another test runs, or exempt for a reason given here.
var readmes = []string{"../README.md"}

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
	// run runs the block as it is shown; nil with a reason means exempt.
	run    func(t *testing.T, s snippet)
	reason string
}

var readmeSnippets = map[string][]snippetRun{
	"../README.md": {
		{starts: "make run", reason: "the README's two commands: CI runs `make test` itself, and e2e TestSQLiteDevModeCreatesItsFile starts the development-mode server `make run` starts"},
		{starts: "# 1. claim the key", run: runCurlQuickstart},
		{starts: "export IDEM_JWT_HS256_SECRET", reason: "Docker Compose: no image can be pulled on this machine; deploy's tests validate the compose, Prometheus and Alertmanager configurations"},
		{starts: "docker compose", reason: "Docker Compose, as above"},
	},
}

// TestReadmeSnippets checks that every code block of the READMEs runs as
// it is shown (or says why it cannot run here), so that a newcomer who
// pastes one gets what the README promises.
func TestReadmeSnippets(t *testing.T) {
	t.Parallel()
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
			used[i] = true
			r := runs[i]
			name := strings.TrimPrefix(file, "../") + ":" + r.starts
			if r.run == nil {
				require.NotEmpty(t, r.reason)
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r.run(t, s)
			})
		}
		for j, r := range runs {
			require.True(t, used[j], "%s: no code block starts with %q any more: update readmeSnippets", file, r.starts)
		}
	}
}

// runCurlQuickstart runs the README's curl quickstart with bash, as pasted
// after the server's export lines, against a live server: the claim is
// 201, the complete stores the answer, and the retry is the replay.
func runCurlQuickstart(t *testing.T, s snippet) {
	interpreter(t, "curl")
	srv := servertest.Start(t, servertest.Options{Tenants: []string{"demo"}})
	token := srv.Token(t, "demo", "keys:write")
	file := filepath.Join(t.TempDir(), "quickstart.sh")
	require.NoError(t, os.WriteFile(file, []byte("set -euo pipefail\n"+s.text), 0o644))
	out := runExample(t, srv.URL(), token, "", interpreter(t, "bash"), file)
	require.Contains(t, out, `"state":"in_flight"`, "the claim")
	require.Contains(t, out, `"state":"completed"`, "the complete")
	require.Regexp(t, `(?i)HTTP/1\.1 200 OK[\s\S]*Idempotent-Replayed: true`, out, "the retry is a replay")
	require.Contains(t, out, `\"id\":\"ord_1\"`, "the replay carries the stored body")
}
