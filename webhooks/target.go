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

// nonPublic lists the prefixes a webhook is never sent to unless private
// targets are allowed, besides what netip classifies as loopback,
// link-local, private, multicast or unspecified.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),     // "this network"
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),  // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),  // NAT64 can reach private IPv4
	netip.MustParsePrefix("2002::/16"),     // 6to4 can reach private IPv4
}

// PublicAddr reports whether ip is an address webhooks may be sent to when
// private targets are not allowed.
func PublicAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
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
		return errors.New("must not be a loopback, link-local or private address (private targets are not allowed)")
	}
	return nil
}

// NewEndpoint checks a tenant's new endpoint (URL per ValidateURL, event
// filter) and returns it enabled or not, with a fresh id and signing
// secret: the one way the API and the CLI create endpoints. A bad input is
// an invalid_request naming its field.
func NewEndpoint(tenantID, rawURL string, events []idem.EventType, enabled, allowPrivate bool) (idem.WebhookEndpoint, error) {
	if err := CheckURL(rawURL, allowPrivate); err != nil {
		return idem.WebhookEndpoint{}, err
	}
	if err := idem.ValidateEventFilter(events); err != nil {
		return idem.WebhookEndpoint{}, err
	}
	return idem.WebhookEndpoint{
		TenantID: tenantID, ID: idem.NewWebhookEndpointID(), URL: rawURL,
		Secret: idem.NewWebhookSecret(), Events: events, Enabled: enabled,
	}, nil
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
