package webhooks

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"

	"github.com/idem-dev/idem"
)

// MaxURLLength bounds an endpoint URL.
const MaxURLLength = 2048

// ErrPrivateTarget is the error of a connection refused because the address
// it resolved to is loopback, link-local, private or otherwise not public.
var ErrPrivateTarget = errors.New("webhook target is not a public address")

// reserved is one range of the IANA special-purpose address registries
// (IPv4 and IPv6) that a webhook is never sent to unless private targets
// are allowed.
type reserved struct {
	prefix netip.Prefix
	// ref is the RFC that sets the range aside and what it is.
	ref string
	// embedded, when set, returns the IPv4 address an address of the range
	// stands for (a translator reaches it): the address is refused only
	// when that IPv4 address is not public.
	embedded func(netip.Addr) netip.Addr
}

// lastIPv4 is the IPv4 address in the last 32 bits of a (NAT64) address.
func lastIPv4(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte(b[12:]))
}

// reservedRanges are the ranges refused besides what netip classifies as
// loopback, link-local, private, multicast or unspecified (those are in
// the table too, for completeness). IPv4-mapped IPv6 addresses
// (::ffff:0:0/96, RFC 4291 §2.5.5.2) are unmapped first and judged as
// the IPv4 address they are. An IPv6 address outside 2000::/3, the only
// block IANA allocates to global unicast (RFC 4291 §2.4), is refused
// whether or not it is listed (NAT64 with a public IPv4 address aside).
var reservedRanges = []reserved{
	// IPv4 (IANA IPv4 Special-Purpose Address Registry).
	{netip.MustParsePrefix("0.0.0.0/8"), "RFC 791: this network", nil},
	{netip.MustParsePrefix("10.0.0.0/8"), "RFC 1918: private", nil},
	{netip.MustParsePrefix("100.64.0.0/10"), "RFC 6598: carrier-grade NAT", nil},
	{netip.MustParsePrefix("127.0.0.0/8"), "RFC 1122: loopback", nil},
	{netip.MustParsePrefix("169.254.0.0/16"), "RFC 3927: link-local (cloud metadata)", nil},
	{netip.MustParsePrefix("172.16.0.0/12"), "RFC 1918: private", nil},
	{netip.MustParsePrefix("192.0.0.0/24"), "RFC 6890: IETF protocol assignments", nil},
	{netip.MustParsePrefix("192.0.2.0/24"), "RFC 5737: documentation (TEST-NET-1)", nil},
	{netip.MustParsePrefix("192.88.99.0/24"), "RFC 7526: 6to4 relay anycast (deprecated)", nil},
	{netip.MustParsePrefix("192.168.0.0/16"), "RFC 1918: private", nil},
	{netip.MustParsePrefix("198.18.0.0/15"), "RFC 2544: benchmarking", nil},
	{netip.MustParsePrefix("198.51.100.0/24"), "RFC 5737: documentation (TEST-NET-2)", nil},
	{netip.MustParsePrefix("203.0.113.0/24"), "RFC 5737: documentation (TEST-NET-3)", nil},
	{netip.MustParsePrefix("224.0.0.0/4"), "RFC 5771: multicast", nil},
	{netip.MustParsePrefix("240.0.0.0/4"), "RFC 1112: reserved; 255.255.255.255 broadcast (RFC 919)", nil},
	// IPv6 (IANA IPv6 Special-Purpose Address Registry).
	{netip.MustParsePrefix("::/96"), "RFC 4291 §2.5.5.1: IPv4-compatible (deprecated; ::a.b.c.d), with :: and ::1", nil},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "RFC 2765: IPv4-translated (SIIT)", nil},
	{netip.MustParsePrefix("64:ff9b::/96"), "RFC 6052: NAT64 well-known prefix, refused when the IPv4 address it embeds is not public", lastIPv4},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "RFC 8215: local-use NAT64 (reaches the local network)", nil},
	{netip.MustParsePrefix("100::/64"), "RFC 6666: discard-only", nil},
	{netip.MustParsePrefix("100:0:0:1::/64"), "RFC 9780: dummy prefix", nil},
	{netip.MustParsePrefix("2001::/23"), "RFC 2928: IETF protocol assignments (Teredo 2001::/32, RFC 4380; benchmarking 2001:2::/48, RFC 5180; ORCHID)", nil},
	{netip.MustParsePrefix("2001:db8::/32"), "RFC 3849: documentation", nil},
	{netip.MustParsePrefix("2002::/16"), "RFC 3056: 6to4 (deprecated by RFC 7526; may embed a private IPv4 address)", nil},
	{netip.MustParsePrefix("3fff::/20"), "RFC 9637: documentation", nil},
	{netip.MustParsePrefix("5f00::/16"), "RFC 9602: SRv6 SIDs", nil},
	{netip.MustParsePrefix("fc00::/7"), "RFC 4193: unique local", nil},
	{netip.MustParsePrefix("fe80::/10"), "RFC 4291: link-local", nil},
	{netip.MustParsePrefix("fec0::/10"), "RFC 3879: site-local (deprecated)", nil},
	{netip.MustParsePrefix("ff00::/8"), "RFC 4291: multicast", nil},
}

// globalUnicast is the IPv6 block IANA allocates to global unicast.
var globalUnicast = netip.MustParsePrefix("2000::/3")

// PublicAddr reports whether ip is an address webhooks may be sent to when
// private targets are not allowed: not in reservedRanges, not classified
// by netip as loopback, private, link-local, multicast or unspecified,
// and, for IPv6, inside 2000::/3 (or NAT64 of a public IPv4 address).
func PublicAddr(ip netip.Addr) bool {
	// A zone never makes an address public, and netip.Prefix.Contains is
	// false for any address with one.
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return false
	}
	for _, r := range reservedRanges {
		if r.prefix.Contains(ip) {
			return r.embedded != nil && PublicAddr(r.embedded(ip))
		}
	}
	return ip.Is4() || globalUnicast.Contains(ip)
}

// ValidateURL checks an endpoint URL when it is registered: absolute http
// or https, a host, no user info (a secret in a URL would be shown and
// logged), at most MaxURLLength. Unless allowPrivate, a literal address
// must be public and localhost names are refused. Names are checked again,
// resolved, at every connection (see dialControl): a name may point
// anywhere later (DNS rebinding).
func ValidateURL(raw string, allowPrivate bool) error {
	if len(raw) > MaxURLLength {
		return fmt.Errorf("is longer than %d characters", MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return errors.New("must be an absolute http or https URL")
	}
	if u.User != nil {
		return errors.New("must not contain user info")
	}
	if u.Fragment != "" {
		return errors.New("must not contain a fragment")
	}
	if allowPrivate {
		return nil
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return errors.New("must not name localhost (private targets are not allowed)")
	}
	if ip, err := netip.ParseAddr(host); err == nil && !PublicAddr(ip) {
		return errors.New("must not be a loopback, link-local, private or reserved address (private targets are not allowed)")
	}
	return nil
}

// NewEndpoint checks a tenant's new endpoint (URL per ValidateURL, event
// filter) and returns it enabled or not, with a fresh id and signing
// secret: the one way the API and the CLI create endpoints. A bad input is
// an invalid_request naming its field.
func NewEndpoint(tenantID, rawURL string, events []idem.EventType, enabled, allowPrivate bool) (idem.WebhookEndpoint, error) {
	e := idem.WebhookEndpoint{
		TenantID: tenantID, ID: idem.NewWebhookEndpointID(),
		Secret: idem.NewWebhookSecret(), Enabled: enabled,
	}
	if err := (EndpointPatch{URL: &rawURL, Events: &events}).Apply(&e, allowPrivate); err != nil {
		return idem.WebhookEndpoint{}, err
	}
	return e, nil
}

// EndpointPatch is a change to an endpoint (PATCH /v1/webhooks/{id},
// `server webhooks set`): a nil field keeps its value; enabling clears the
// failure streak (the store's UpdateWebhookEndpoint).
type EndpointPatch struct {
	URL     *string
	Events  *[]idem.EventType
	Enabled *bool
}

// Apply checks the patch's fields with the rules of NewEndpoint and sets
// them on e: the one way the API and the CLI create and change endpoints.
// A bad input is an invalid_request naming its field, and e is then left
// as it was in the fields not yet set.
func (p EndpointPatch) Apply(e *idem.WebhookEndpoint, allowPrivate bool) error {
	if p.URL != nil {
		if err := CheckURL(*p.URL, allowPrivate); err != nil {
			return err
		}
		e.URL = *p.URL
	}
	if p.Events != nil {
		if err := idem.ValidateEventFilter(*p.Events); err != nil {
			return err
		}
		e.Events = *p.Events
	}
	if p.Enabled != nil {
		e.Enabled = *p.Enabled
	}
	return nil
}

// CheckURL is ValidateURL as an invalid_request naming "url".
func CheckURL(rawURL string, allowPrivate bool) error {
	if err := ValidateURL(rawURL, allowPrivate); err != nil {
		return &idem.Error{Code: idem.CodeInvalidRequest, Detail: "url " + err.Error(),
			Fields: []idem.FieldError{{Field: "url", Message: err.Error()}}, Err: err}
	}
	return nil
}

// dialControl refuses, at connect time, every address that is not public:
// it sees the address the name resolved to for this very connection, so a
// name that was public at registration and resolves to a private address
// now is refused too.
func dialControl(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrPrivateTarget, address)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !PublicAddr(ip) {
		return fmt.Errorf("%w: %s", ErrPrivateTarget, host)
	}
	return nil
}

// NewCompleter checks a tenant's new completer (the resume endpoint of
// issue 24): its URL as a webhook endpoint's (ValidateURL, and the same
// connect-time refusal of private targets when called, since the completer
// calls it with NewClient), its operation pattern; and returns it with a
// fresh id and signing secret. A bad input is an invalid_request naming
// its field.
func NewCompleter(tenantID, rawURL, pattern string, allowPrivate bool) (idem.Completer, error) {
	if err := CheckURL(rawURL, allowPrivate); err != nil {
		return idem.Completer{}, err
	}
	if err := idem.ValidateOperationPattern(pattern); err != nil {
		return idem.Completer{}, err
	}
	return idem.Completer{
		TenantID: tenantID, ID: idem.NewCompleterID(), URL: rawURL,
		Secret: idem.NewWebhookSecret(), OperationPattern: pattern,
	}, nil
}
