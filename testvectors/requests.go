// Package testvectors reads the shared request-line vectors
// (frontdoor/targets.json and frontdoor/operations.json) for the root
// module's Go tests, and sends them the way the files say, so the gateway's,
// the idemhttp end-to-end and the server-side vector tests read one typed
// copy of each file instead of each declaring its own struct, path and
// base64 decoding. The files are embedded: no test depends on the folder
// it runs from.
//
// client/frontdoor is a module of its own (the root module depends on it),
// so its vectors_test.go keeps a reader of its own.
package testvectors

import (
	"bufio"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"testing"

	"github.com/stretchr/testify/require"
)

//go:embed frontdoor/targets.json frontdoor/operations.json
var files embed.FS

// Request is one vector of targets.json or operations.json: a POST whose
// request line carries Target byte for byte. The files give the target as
// text (target) or, for bytes a JSON string cannot hold as they are, as
// target_base64; Target is either, decoded, so no test decodes it again.
type Request[E any] struct {
	// Name identifies the vector in a failure message.
	Name string
	// Target is the request target to send on the request line, raw.
	Target string
	// Expect is what the file expects of that request.
	Expect E
}

// TargetExpect is what targets.json expects of a request line: the
// fingerprint document's path and query as the front door must read them,
// and the record's fingerprint.
type TargetExpect struct {
	// Path is the document's path: the target's, as it arrived.
	Path string `json:"path"`
	// Query is the document's query: the bytes after the first '?'.
	Query string `json:"query"`
	// Fingerprint is the record's fingerprint of that document.
	Fingerprint string `json:"fingerprint"`
}

// OperationExpect is what operations.json expects of a request line to a
// path no route pattern names: the claim's operation label.
type OperationExpect struct {
	// Operation is the label the claim must carry.
	Operation string `json:"operation"`
}

// Targets returns the vectors of frontdoor/targets.json (rule 4: the path
// and query of the fingerprint document), failing the test when the file
// is unreadable or empty.
func Targets(tb testing.TB) []Request[TargetExpect] {
	tb.Helper()
	return load[TargetExpect](tb, "targets.json")
}

// Operations returns the vectors of frontdoor/operations.json (rule 4: the
// operation label of a request no route names), failing the test when the
// file is unreadable or empty.
func Operations(tb testing.TB) []Request[OperationExpect] {
	tb.Helper()
	return load[OperationExpect](tb, "operations.json")
}

func load[E any](tb testing.TB, name string) []Request[E] {
	tb.Helper()
	b, err := files.ReadFile(path.Join("frontdoor", name))
	require.NoError(tb, err)
	var file struct {
		Vectors []struct {
			Name         string `json:"name"`
			Target       string `json:"target"`
			TargetBase64 string `json:"target_base64"`
			Expect       E      `json:"expect"`
		} `json:"vectors"`
	}
	require.NoError(tb, json.Unmarshal(b, &file), name)
	require.NotEmpty(tb, file.Vectors, name)
	out := make([]Request[E], len(file.Vectors))
	for i, v := range file.Vectors {
		target := v.Target
		if v.TargetBase64 != "" {
			raw, err := base64.StdEncoding.DecodeString(v.TargetBase64)
			require.NoError(tb, err, "%s: %s: target_base64", name, v.Name)
			target = string(raw)
		}
		out[i] = Request[E]{Name: v.Name, Target: target, Expect: v.Expect}
	}
	return out
}

// Post sends the request the vectors describe to addr (host:port) over a
// plain TCP connection: POST with target on the request line byte for byte
// (an HTTP client library would escape what the vectors need raw),
// Idempotency-Key key, Content-Type: application/json and the body {}. It
// returns the answer's status, the body read and dropped.
func Post(tb testing.TB, addr, target, key string) int {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(tb, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", target, key)
	require.NoError(tb, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(tb, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
