package webhooks

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPublicAddr is the classification table: every range of the IANA
// special-purpose registries a webhook must not reach, by an address
// inside it (and the edges of the ranges that embed an IPv4 address).
// Before the IPv4-compatible, local-use NAT64, site-local, discard,
// documentation, Teredo and other rows were added, [::127.0.0.1],
// [64:ff9b:1::1] and [fec0::1] passed as public.
func TestPublicAddr(t *testing.T) {
	t.Parallel()
	refused := map[string]string{
		"127.0.0.1":       "loopback",
		"10.1.2.3":        "RFC 1918",
		"172.16.0.1":      "RFC 1918",
		"192.168.1.1":     "RFC 1918",
		"169.254.169.254": "cloud metadata",
		"0.0.0.0":         "unspecified",
		"0.1.2.3":         "this network",
		"100.64.0.1":      "CGNAT",
		"192.0.0.8":       "IETF protocol assignments",
		"192.0.2.1":       "TEST-NET-1",
		"198.51.100.7":    "TEST-NET-2",
		"203.0.113.9":     "TEST-NET-3",
		"198.18.0.1":      "benchmarking",
		"192.88.99.1":     "6to4 relay anycast",
		"224.0.0.1":       "multicast",
		"239.255.255.250": "multicast",
		"240.0.0.1":       "reserved",
		"255.255.255.255": "broadcast",

		"::":                                   "unspecified",
		"::1":                                  "loopback",
		"::127.0.0.1":                          "IPv4-compatible loopback",
		"::10.0.0.1":                           "IPv4-compatible private",
		"::8.8.8.8":                            "IPv4-compatible (deprecated) even of a public address",
		"::ffff:127.0.0.1":                     "IPv4-mapped loopback",
		"::ffff:169.254.169.254":               "IPv4-mapped metadata",
		"::ffff:10.0.0.1":                      "IPv4-mapped private",
		"::ffff:0:127.0.0.1":                   "IPv4-translated",
		"64:ff9b::127.0.0.1":                   "NAT64 of loopback",
		"64:ff9b::a9fe:a9fe":                   "NAT64 of metadata",
		"64:ff9b::10.0.0.1":                    "NAT64 of private",
		"64:ff9b:1::1":                         "local-use NAT64",
		"64:ff9b:1:ffff::8.8.8.8":              "local-use NAT64, whatever it embeds",
		"100::1":                               "discard-only",
		"100:0:0:1::1":                         "dummy prefix",
		"2001::1":                              "Teredo",
		"2001:0:4136:e378:8000:63bf:3fff:fdd2": "Teredo",
		"2001:2::1":                            "benchmarking",
		"2001:10::1":                           "ORCHID",
		"2001:db8::1":                          "documentation",
		"3fff::1":                              "documentation",
		"2002:7f00:1::1":                       "6to4 of loopback",
		"2002:808:808::1":                      "6to4, deprecated",
		"5f00::1":                              "SRv6 SID",
		"fc00::1":                              "unique local",
		"fd12:3456::1":                         "unique local",
		"fe80::1":                              "link-local",
		"fe80::1%eth0":                         "link-local with a zone",
		"2001:db8::1%eth0":                     "documentation with a zone",
		"fec0::1":                              "site-local",
		"feff::1":                              "site-local",
		"ff02::1":                              "multicast",
		"ff0e::1":                              "multicast",
		"4000::1":                              "outside 2000::/3",
		"1::1":                                 "outside 2000::/3",
	}
	for a, why := range refused {
		require.False(t, PublicAddr(netip.MustParseAddr(a)), "%s (%s) passed as public", a, why)
	}
	for _, a := range []string{"8.8.8.8", "1.1.1.1", "192.0.3.1", "100.128.0.1", "198.20.0.1", "223.255.255.254",
		"::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2001:4860:4860::8888", "2606:4700:4700::1111", "2001:200::1", "2003::1", "3ffe::1"} {
		require.True(t, PublicAddr(netip.MustParseAddr(a)), a)
	}
	for _, r := range reservedRanges {
		require.NotEmpty(t, r.ref, r.prefix.String())
		require.False(t, PublicAddr(r.prefix.Addr()), "the first address of %s (%s)", r.prefix, r.ref)
	}
}

func TestValidateURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://hooks.example.com/x", "http://example.com:8080/a?b=c", "https://8.8.8.8/", "https://[64:ff9b::808:808]/"} {
		require.NoError(t, ValidateURL(u, false), u)
	}
	for _, u := range []string{"ftp://example.com", "/relative", "https://", "https://user:pw@example.com/",
		"http://127.0.0.1:9000/", "http://[::1]/", "http://localhost/", "http://a.localhost/", "http://169.254.169.254/latest",
		"http://10.0.0.1/", "https://example.com/#frag", "http://[::127.0.0.1]/", "http://[64:ff9b:1::1]/",
		"http://[fec0::1]/", "http://[fe80::1%25eth0]/", "http://[2001:db8::1]/"} {
		require.Error(t, ValidateURL(u, false), u)
	}
	require.NoError(t, ValidateURL("http://127.0.0.1:9000/", true), "allowed by the operator")
	require.Error(t, ValidateURL("http://u:p@127.0.0.1/", true), "user info never")
}
