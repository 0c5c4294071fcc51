package webhooks

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDescribeNamesNoAddress: every failure the client can meet becomes a
// reason without the addresses (target, resolver, local) its error text
// carries.
func TestDescribeNamesNoAddress(t *testing.T) {
	t.Parallel()
	target := &net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 443}
	dial := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://hooks.example.com/x?token=s3cret", Err: &net.OpError{Op: "dial", Net: "tcp", Addr: target, Err: err}}
	}
	dns := func(e net.DNSError) error {
		e.Name, e.Server = "hooks.example.com", "10.255.255.53:53"
		return dial(&e)
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{dial(fmt.Errorf("%w: %s", ErrPrivateTarget, "10.0.0.7")), reasonPrivateTarget},
		{dns(net.DNSError{Err: "no such host", IsNotFound: true}), reasonNoSuchHost},
		{dns(net.DNSError{Err: "read udp 10.0.0.2:4444->10.255.255.53:53: i/o timeout", IsTimeout: true}), reasonDNSTimeout},
		{dns(net.DNSError{Err: "server misbehaving", IsTemporary: true}), reasonDNSFailed},
		{dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), reasonRefused},
		{dial(os.NewSyscallError("read", syscall.ECONNRESET)), reasonReset},
		{dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), reasonUnreachable},
		{dial(os.NewSyscallError("connect", syscall.ENETUNREACH)), reasonUnreachable},
		{dial(os.ErrDeadlineExceeded), reasonTimeout},
		{dial(os.NewSyscallError("connect", syscall.EACCES)), reasonConnFailed},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, reasonTLSAuthority},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: &tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: &x509.Certificate{}, Host: "10.0.0.7"}}}, reasonTLSHostname},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: &tls.CertificateVerificationError{Err: x509.CertificateInvalidError{Reason: x509.Expired}}}, reasonTLSInvalid},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}}, reasonTLSFailed},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: io.EOF}, reasonClosed},
		{&url.Error{Op: "Post", URL: "https://10.0.0.7/", Err: errors.New(`net/http: HTTP/1.x transport connection broken: malformed HTTP status code "10.0.0.7"`)}, reasonNoAnswer},
	} {
		got := describe(c.err)
		require.Equal(t, c.want, got, c.err.Error())
		require.NotRegexp(t, `\d+\.\d+\.\d+\.\d+|:53|s3cret|example\.com`, got)
	}
}

// The operator's log keeps the cause, without the URL.
func TestRequestErrorCause(t *testing.T) {
	t.Parallel()
	err := &url.Error{Op: "Post", URL: "https://hooks.example.com/x?token=s3cret", Err: &net.DNSError{Err: "no such host", Name: "hooks.example.com", Server: "10.255.255.53:53", IsNotFound: true}}
	re := &requestError{reason: describe(err), cause: withoutURL(err)}
	require.Equal(t, reasonNoSuchHost, re.Error())
	cause := causeOf(re).Error()
	require.Contains(t, cause, "10.255.255.53:53")
	require.False(t, strings.Contains(cause, "s3cret"), cause)
}
