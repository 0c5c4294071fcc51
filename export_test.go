package idem

// CanonicalTwoPass and CanonicalOnePass expose CanonicalJSON's two paths to
// the tests that compare them.
var (
	CanonicalTwoPass = canonicalTwoPass
	CanonicalOnePass = func(doc []byte) ([]byte, bool) { return canonicalOnePass(nil, doc) }
)

// CheckIJSONReference is CheckIJSON's earlier scanner, the oracle the
// current one is compared with.
var CheckIJSONReference = checkIJSONReference
