package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"

	"github.com/golang-jwt/jwt/v5"
)

// publicKey is one JWKS key with the only algorithm it may be used with.
type publicKey struct {
	kid string
	alg string
	key any // ed25519.PublicKey, *ecdsa.PublicKey or *rsa.PublicKey
	// encodings are byte forms of the key an attacker might use as an HMAC
	// secret (raw, DER, PEM); the verifier refuses a secret equal to one.
	encodings [][]byte
}

// encodedEqual reports whether secret equals one of the key's encodings.
func (k publicKey) encodedEqual(secret []byte) bool {
	for _, e := range k.encodings {
		if constantTimeEqual(e, secret) {
			return true
		}
	}
	return false
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	N   string `json:"n"`
	E   string `json:"e"`
	D   string `json:"d"`
}

// MinRSABits is the smallest RSA modulus accepted from a JWKS.
const MinRSABits = 2048

// parseJWKS parses a JWKS document. Keys marked "use":"enc" are skipped;
// any other key that is not an Ed25519, P-256 or RSA public key is an error,
// as is a private key, a duplicate kid, or an alg that does not match the
// key type.
func parseJWKS(doc []byte) ([]publicKey, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		return nil, fmt.Errorf("parse jwks: %w", err)
	}
	var out []publicKey
	seen := map[string]bool{}
	for i, j := range set.Keys {
		if j.Use == "enc" {
			continue
		}
		if j.Use != "" && j.Use != "sig" {
			return nil, fmt.Errorf("parse jwks: key %d: unsupported use %q", i, j.Use)
		}
		if j.D != "" {
			return nil, fmt.Errorf("parse jwks: key %d (%q) holds private key material; the JWKS must hold public keys only", i, j.Kid)
		}
		if seen[j.Kid] {
			return nil, fmt.Errorf("parse jwks: duplicate kid %q", j.Kid)
		}
		seen[j.Kid] = true
		k, err := parseJWK(j)
		if err != nil {
			return nil, fmt.Errorf("parse jwks: key %d (%q): %w", i, j.Kid, err)
		}
		if j.Alg != "" && j.Alg != k.alg {
			return nil, fmt.Errorf("parse jwks: key %d (%q): alg %q does not match key type %s (only %s)", i, j.Kid, j.Alg, j.Kty, k.alg)
		}
		der, err := x509.MarshalPKIXPublicKey(k.key)
		if err != nil {
			return nil, fmt.Errorf("parse jwks: key %d (%q): %w", i, j.Kid, err)
		}
		k.encodings = append(k.encodings, der, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
		out = append(out, k)
	}
	if len(out) > 1 {
		for _, k := range out {
			if k.kid == "" {
				return nil, errors.New("parse jwks: every key needs a kid when the set holds more than one")
			}
		}
	}
	return out, nil
}

func parseJWK(j jwk) (publicKey, error) {
	k := publicKey{kid: j.Kid}
	switch j.Kty {
	case "OKP":
		if j.Crv != "Ed25519" {
			return k, fmt.Errorf("unsupported OKP curve %q", j.Crv)
		}
		x, err := b64(j.X, "x")
		if err != nil {
			return k, err
		}
		if len(x) != ed25519.PublicKeySize {
			return k, fmt.Errorf("x is %d bytes; an Ed25519 key is %d", len(x), ed25519.PublicKeySize)
		}
		k.alg, k.key = jwt.SigningMethodEdDSA.Alg(), ed25519.PublicKey(x)
		k.encodings = append(k.encodings, x)
	case "EC":
		if j.Crv != "P-256" {
			return k, fmt.Errorf("unsupported EC curve %q", j.Crv)
		}
		x, err := b64(j.X, "x")
		if err != nil {
			return k, err
		}
		y, err := b64(j.Y, "y")
		if err != nil {
			return k, err
		}
		if len(x) != 32 || len(y) != 32 {
			return k, errors.New("x and y of a P-256 key must be 32 bytes each")
		}
		// Build the uncompressed point and let the ecdh-backed parser check
		// that it lies on the curve.
		point := append(append([]byte{4}, x...), y...)
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), point)
		if err != nil {
			return k, fmt.Errorf("invalid P-256 point: %w", err)
		}
		k.alg, k.key = jwt.SigningMethodES256.Alg(), pub
		k.encodings = append(k.encodings, point)
	case "RSA":
		n, err := b64(j.N, "n")
		if err != nil {
			return k, err
		}
		e, err := b64(j.E, "e")
		if err != nil {
			return k, err
		}
		nn, ee := new(big.Int).SetBytes(n), new(big.Int).SetBytes(e)
		if nn.BitLen() < MinRSABits {
			return k, fmt.Errorf("RSA modulus is %d bits; at least %d are required", nn.BitLen(), MinRSABits)
		}
		if !ee.IsInt64() || ee.Int64() < 3 || ee.Int64() > 1<<31-1 {
			return k, errors.New("unsupported RSA exponent")
		}
		pub := &rsa.PublicKey{N: nn, E: int(ee.Int64())}
		k.alg, k.key = jwt.SigningMethodRS256.Alg(), pub
		k.encodings = append(k.encodings, x509.MarshalPKCS1PublicKey(pub))
	default:
		return k, fmt.Errorf("unsupported key type %q", j.Kty)
	}
	return k, nil
}

func b64(s, field string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("%s is missing", field)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%s is not base64url: %w", field, err)
	}
	return b, nil
}
