package web_test

import (
	"context"
	"encoding/json"
	"html"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idem-dev/idem/canon"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/testkit/pgtest"
	"github.com/idem-dev/idem/web"
)

// The program snippets of the docs pages (issue 26): each is an example file
// shown through <pre data-src>, run here as shown. TestPageSnippetKinds keeps
// it so: a new inline program no test runs fails it.

// runLinesOf runs argv in this package's directory and returns its output
// lines, failing the test when it exits non-zero.
func runLinesOf(t *testing.T, argv ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	require.NoError(t, err, "%v:\n%s", argv, out)
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}

// TestPageEscapeKeyExamples runs the keys page's path-escaping examples
// (Python, Node.js, Go) on the key the page names, a/b%c, and on every valid
// key of the shared vectors (testvectors/sdk/keys.json): each path is one
// segment that the server's path decoding turns back into the key.
func TestPageEscapeKeyExamples(t *testing.T) {
	t.Parallel()
	var vectors struct {
		Validate []struct {
			Key   string `json:"key"`
			Valid bool   `json:"valid"`
		} `json:"validate"`
	}
	b, err := os.ReadFile(filepath.Join("..", "testvectors", "sdk", "keys.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &vectors))
	keys := []string{"a/b%c"}
	for _, v := range vectors.Validate {
		if v.Valid {
			keys = append(keys, v.Key)
		}
	}
	require.Greater(t, len(keys), 5)
	for _, tc := range []struct {
		name string
		argv func(t *testing.T) []string
	}{
		{"python", func(t *testing.T) []string {
			return []string{interpreter(t, "python3"), filepath.Join(examplesDir, "keys", "escape_key.py")}
		}},
		{"node", func(t *testing.T) []string {
			return []string{interpreter(t, "node"), filepath.Join(examplesDir, "keys", "escape_key.mjs")}
		}},
		{"go", func(t *testing.T) []string {
			return []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "run", "./" + examplesDir + "/go/escapekey"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lines := runLinesOf(t, append(tc.argv(t), keys...)...)
			require.Len(t, lines, len(keys))
			require.Equal(t, "/v1/keys/a%2Fb%25c", lines[0], "the page says so")
			for i, key := range keys {
				seg, ok := strings.CutPrefix(lines[i], "/v1/keys/")
				require.True(t, ok, lines[i])
				require.NotContains(t, seg, "/", "the key is one path segment")
				got, err := url.PathUnescape(seg)
				require.NoError(t, err)
				require.Equal(t, key, got, "the path of %q", key)
			}
		})
	}
}

// TestPageDeriveKeyExample runs the keys page's key derivations and checks
// what the page says they print: the event-derived and request-scoped keys,
// and one job key reused by all three attempts, each a valid key.
func TestPageDeriveKeyExample(t *testing.T) {
	t.Parallel()
	lines := runLinesOf(t, interpreter(t, "python3"), filepath.Join(examplesDir, "keys", "derive_key.py"))
	require.Len(t, lines, 7, "%q", lines)
	require.Equal(t, []string{"order-confirm-4711", "payout-pb_9-acct_3", "webhook-stripe-evt_1Q", "api-cus_7-c0ffee-12"}, lines[:4])
	require.Regexp(t, `^job-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$`, lines[4])
	require.Equal(t, []string{lines[4], lines[4]}, lines[5:], "every retry reuses the job's key")
	for _, key := range lines {
		require.NoError(t, client.ValidateKey(key), key)
	}
}

// TestPageFencingSQL runs the keys page's fencing SQL on PostgreSQL in a
// fresh schema: the newer token's write updates the order, the stale
// token's write after it updates no row, and the row keeps the newer write.
func TestPageFencingSQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	// The user's own table, before the page's ALTER.
	_, err = conn.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL DEFAULT 'new', confirmed_at timestamptz)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO orders (id) VALUES ('ord_4711')`)
	require.NoError(t, err)

	b, err := os.ReadFile(filepath.Join(examplesDir, "keys", "fencing.sql"))
	require.NoError(t, err)
	stmts := sqlStatements(string(b))
	require.Len(t, stmts, 2, "the ALTER and the UPDATE: %q", stmts)
	_, err = conn.Exec(ctx, stmts[0])
	require.NoError(t, err)

	write := func(token int64) int64 {
		tag, err := conn.Exec(ctx, stmts[1], token, "ord_4711")
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	require.EqualValues(t, 1, write(8), "worker B, token 8, writes")
	require.EqualValues(t, 0, write(7), "worker A's stale token 7 is refused: 0 rows")
	var status string
	var token int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT status, idem_token FROM orders WHERE id = 'ord_4711'`).Scan(&status, &token))
	require.Equal(t, "confirmed", status)
	require.EqualValues(t, 8, token, "the row keeps the newer token's write")
}

// sqlStatements splits a SQL file into its statements, without the --
// comments (the example has no -- or ; inside strings).
func sqlStatements(src string) []string {
	var b strings.Builder
	for _, line := range strings.Split(src, "\n") {
		line, _, _ = strings.Cut(line, "--")
		b.WriteString(line + "\n")
	}
	var stmts []string
	for _, s := range strings.Split(b.String(), ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

var (
	preBlock = regexp.MustCompile(`(?s)<pre([^>]*)>(.*?)</pre>`)
	dataKind = regexp.MustCompile(`\sdata-kind="([^"]*)"`)
	tagRE    = regexp.MustCompile(`<[^>]*>`)
	shellRE  = regexp.MustCompile(`^(\$ |curl |export |idem )`)
	httpRE   = regexp.MustCompile(`^(HTTP/1\.1 \d{3} |(GET|POST|PUT|PATCH|DELETE) +/)`)
	configRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// blockText is the text a <pre> block shows: its tags stripped, its
// entities decoded.
func blockText(inner string) string {
	return html.UnescapeString(tagRE.ReplaceAllString(inner, ""))
}

// TestPageSnippetKinds checks that every <pre> block of the docs pages is
// one of:
//   - data-src="…": an example file, which a test runs (TestDocsLinksResolve
//     checks that the file exists; the tests of docs_test.go,
//     frameworks_test.go, snippets_test.go and this file run it);
//   - data-kind="pseudocode" or "wrong" (shown labelled so by docs.css, never
//     meant to be run), "output" (what a program prints or a timeline), or
//     "annotated" (JSON bodies, one a line, between // comment lines: every
//     other line must parse as JSON, and TestPageFingerprintListing checks
//     what the keys page's one claims);
//   - a listing this test recognises by its first line that is not a #
//     comment: a shell command line (starting "$ ", "curl ", "export " or
//     "idem "), an HTTP exchange ("HTTP/1.1 200 …" or "POST /…"), or a YAML
//     or JSON configuration (a mapping whose top-level keys are lower-case
//     identifiers).
//
// Anything else is an inline program no test runs: make it an example file.
func TestPageSnippetKinds(t *testing.T) {
	t.Parallel()
	docs := web.Docs()
	blocks := 0
	require.NoError(t, fs.WalkDir(docs, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(p) != ".html" {
			return err
		}
		b, err := fs.ReadFile(docs, p)
		if err != nil {
			return err
		}
		for _, m := range preBlock.FindAllStringSubmatch(string(b), -1) {
			blocks++
			attrs, text := m[1], blockText(m[2])
			first := firstLine(text)
			if strings.Contains(attrs, "data-src=") {
				require.Empty(t, strings.TrimSpace(text), "%s: a data-src block is filled from its file", p)
				continue
			}
			if k := dataKind.FindStringSubmatch(attrs); k != nil {
				switch k[1] {
				case "pseudocode", "wrong", "output":
				case "annotated":
					require.NotEmpty(t, annotatedJSON(t, text), "%s: an annotated listing shows JSON", p)
				default:
					t.Errorf("%s: unknown data-kind %q", p, k[1])
				}
				continue
			}
			if shellRE.MatchString(first) || httpRE.MatchString(first) || isConfig(text) {
				continue
			}
			t.Errorf("%s: an inline code block no test runs, starting %q: make it an example file shown through data-src "+
				"and run it in a test, or mark it data-kind=\"pseudocode\", \"wrong\" or \"output\" (see TestPageSnippetKinds)", p, first)
		}
		return nil
	}))
	require.Greater(t, blocks, 20, "the pages have code blocks")
}

// firstLine returns the first line of text that is neither blank nor a #
// comment.
func firstLine(text string) string {
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line
		}
	}
	return ""
}

// isConfig reports whether text is a YAML (or JSON) mapping whose top-level
// keys are lower-case identifiers, as configuration files are; code that
// happens to parse as YAML has other keys (or is a plain string).
func isConfig(text string) bool {
	var m map[string]any
	if yaml.Unmarshal([]byte(text), &m) != nil || len(m) == 0 {
		return false
	}
	for k := range m {
		if !configRE.MatchString(k) {
			return false
		}
	}
	return true
}

// annotatedJSON returns the JSON values of an annotated listing, one per
// line that is not a // comment, failing the test on one that is not JSON.
func annotatedJSON(t *testing.T, text string) []map[string]any {
	t.Helper()
	var docs []map[string]any
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not JSON: %s", line)
		docs = append(docs, m)
	}
	return docs
}

// TestPageFingerprintListing checks the keys page's annotated claim bodies
// against the server: each is a claim body the server takes (an operation,
// with a request, a fingerprint of 1-256 characters, or neither), and the
// reordered, respelled request the comment names has the same fingerprint
// (canon.Fingerprint, the server's) as the one sent, while another amount
// does not.
func TestPageFingerprintListing(t *testing.T) {
	t.Parallel()
	b, err := fs.ReadFile(web.Docs(), "keys/index.html")
	require.NoError(t, err)
	var text string
	for _, m := range preBlock.FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], `data-kind="annotated"`) {
			text = blockText(m[2])
		}
	}
	require.NotEmpty(t, text, "the keys page has the annotated fingerprint listing")
	bodies := annotatedJSON(t, text)
	require.Len(t, bodies, 3)
	for _, body := range bodies {
		require.Equal(t, "POST /v1/payments", body["operation"])
	}
	request, err := json.Marshal(bodies[0]["request"])
	require.NoError(t, err)
	same := regexp.MustCompile(`//\s*(\{.*\}) has the same fingerprint`).FindStringSubmatch(text)
	require.NotNil(t, same, "the listing names a request with the same fingerprint")
	fp, err := canon.Fingerprint(request)
	require.NoError(t, err)
	fpSame, err := canon.Fingerprint([]byte(same[1]))
	require.NoError(t, err)
	require.Equal(t, fp, fpSame, "%s and %s", request, same[1])
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, fp)
	fpOther, err := canon.Fingerprint([]byte(`{"currency":"usd","amount":1001}`))
	require.NoError(t, err)
	require.NotEqual(t, fp, fpOther)

	own, ok := bodies[1]["fingerprint"].(string)
	require.True(t, ok && len(own) >= 1 && len(own) <= 256, "a client fingerprint of 1-256 characters: %v", bodies[1])
	require.NotContains(t, bodies[1], "request", "sending both is 400")
	require.Len(t, bodies[2], 1, "neither: the operation alone")
}
