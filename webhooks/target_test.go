package webhooks

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPublicAddr(t *testing.T) {
	t.Parallel()
	for _, a := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"0.0.0.0", "100.64.0.1", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "224.0.0.1", "::"} {
		require.False(t, PublicAddr(netip.MustParseAddr(a)), a)
	}
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "2001:4860:4860::8888"} {
		require.True(t, PublicAddr(netip.MustParseAddr(a)), a)
	}
}

func TestValidateURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://hooks.example.com/x", "http://example.com:8080/a?b=c", "https://8.8.8.8/"} {
		require.NoError(t, ValidateURL(u, false), u)
	}
	for _, u := range []string{"ftp://example.com", "/relative", "https://", "https://user:pw@example.com/",
		"http://127.0.0.1:9000/", "http://[::1]/", "http://localhost/", "http://a.localhost/", "http://169.254.169.254/latest",
		"http://10.0.0.1/", "https://example.com/#frag"} {
		require.Error(t, ValidateURL(u, false), u)
	}
	require.NoError(t, ValidateURL("http://127.0.0.1:9000/", true), "allowed by the operator")
	require.Error(t, ValidateURL("http://u:p@127.0.0.1/", true), "user info never")
}
