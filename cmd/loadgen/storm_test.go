package main

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseStormWorkers: -workers names one SDK per process; the callers
// must leave each process one at least.
func TestParseStormWorkers(t *testing.T) {
	t.Parallel()
	base := []string{"-server-bin", "idem", "-database-url", "postgres://u@127.0.0.1/db"}
	c, err := parseStorm(base, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"go", "go", "python", "node"}, c.workers)
	c, err = parseStorm(append(base, "-workers", "node:1,go:0,python:2"), io.Discard)
	require.NoError(t, err)
	require.Equal(t, []string{"node", "python", "python"}, c.workers)
	for _, bad := range []string{"ruby:1", "go", "go:-1", "go:0", "go:17"} {
		_, err := parseStorm(append(base, "-workers", bad), io.Discard)
		require.Error(t, err, bad)
	}
	_, err = parseStorm(append(base, "-workers", "go:3", "-callers", "2"), io.Discard)
	require.Error(t, err)
}

// TestEffectSinkLedger: the sink counts each key's side effects; a key
// recorded twice is one duplicate.
func TestEffectSinkLedger(t *testing.T) {
	t.Parallel()
	s, err := newEffectSink()
	require.NoError(t, err)
	defer s.close()
	for _, k := range []string{"a", "b", "a", "c", "a"} {
		require.NoError(t, sideEffect(t.Context(), &http.Client{}, s.url, k))
	}
	effects, dups := s.ledger()
	require.Equal(t, int64(5), effects)
	require.Equal(t, int64(1), dups)
}
