package client_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idem-dev/idem/client"
)

func TestKey(t *testing.T) {
	t.Parallel()
	k, err := client.Key("order-confirm", "ord_42")
	require.NoError(t, err)
	require.Equal(t, "order-confirm:ord_42", k)

	// Escaping keeps different part lists apart and the key printable.
	a, _ := client.Key("a:b", "c")
	b, _ := client.Key("a", "b:c")
	require.NotEqual(t, a, b)
	k, err = client.Key("pay", "user 7", "ünï", "50%")
	require.NoError(t, err)
	require.Equal(t, "pay:user%207:%C3%BCn%C3%AF:50%25", k)
	require.NoError(t, client.ValidateKey(k))

	// Long input: shortened deterministically to 255 bytes.
	long := strings.Repeat("x", 400)
	k1, err := client.Key("evt", long)
	require.NoError(t, err)
	k2, _ := client.Key("evt", long)
	k3, _ := client.Key("evt", long+"y")
	require.Len(t, k1, client.MaxKeyBytes)
	require.Equal(t, k1, k2)
	require.NotEqual(t, k1, k3)
	require.NoError(t, client.ValidateKey(k1))

	for _, bad := range [][]string{nil, {""}, {"a", ""}} {
		_, err := client.Key(bad...)
		require.ErrorIs(t, err, client.ErrInvalidKey)
	}
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	require.NoError(t, client.ValidateKey("order-42"))
	require.NoError(t, client.ValidateKey(strings.Repeat("k", 255)))
	for _, bad := range []string{"", strings.Repeat("k", 256), "a b", "tab\t", "é", "\x7f"} {
		require.ErrorIs(t, client.ValidateKey(bad), client.ErrInvalidKey, "%q", bad)
	}
}

func TestResponseJSON(t *testing.T) {
	t.Parallel()
	for _, r := range []client.Response{
		{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"id":"ord_1"}`)},
		{Status: 200, Body: []byte{0xff, 0x00, 0x01}},
		{Status: 204, Body: []byte{}},
	} {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		var back client.Response
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, r.Status, back.Status)
		require.Equal(t, r.Headers, back.Headers)
		require.Equal(t, string(r.Body), string(back.Body))
	}
	b, _ := json.Marshal(client.Response{Status: 200, Body: []byte{0xff}})
	require.JSONEq(t, `{"status":200,"body":"/w==","body_encoding":"base64"}`, string(b))
}

func TestRecordJSONNulls(t *testing.T) {
	t.Parallel()
	var cr client.ClaimResult
	require.NoError(t, json.Unmarshal([]byte(`{"key":"order-42","state":"in_flight","fencing_token":7,"attempt":2,
		"resumed":true,"lease_expires_at":"2026-11-29T10:00:30Z","recovery_point":null,"recovery_data":null}`), &cr))
	require.True(t, cr.Resumed)
	require.Equal(t, int64(7), cr.FencingToken)
	require.Equal(t, 2, cr.Attempt)
	require.Empty(t, cr.RecoveryPoint)
	require.Nil(t, cr.RecoveryData)
	require.Equal(t, 2026, cr.LeaseExpiresAt.Year())

	var rec client.Record
	require.NoError(t, json.Unmarshal([]byte(`{"key":"k","state":"completed","lease_expires_at":null,"recovery_point":"charged",
		"recovery_data":{"charge":"ch_1"},"response":{"status":201,"headers":{"A":"b"},"body":"hi","body_encoding":"utf8"}}`), &rec))
	require.True(t, rec.LeaseExpiresAt.IsZero())
	require.Equal(t, "charged", rec.RecoveryPoint)
	require.JSONEq(t, `{"charge":"ch_1"}`, string(rec.RecoveryData))
	require.Equal(t, "hi", string(rec.Response.Body))
}
