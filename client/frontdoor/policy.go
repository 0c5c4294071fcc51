package frontdoor

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Requirement says what a front door does with a request of one method.
type Requirement int

// The requirements of a method.
const (
	// Pass: never claimed, the request goes straight to the handler.
	Pass Requirement = iota
	// Optional: protected when it carries a key, passed through when not.
	Optional
	// Required: protected; without a key it is refused with 400
	// idempotency_key_missing.
	Required
)

// String returns the requirement's name as the vectors spell it.
func (r Requirement) String() string {
	switch r {
	case Optional:
		return "optional"
	case Required:
		return "required"
	}
	return "pass"
}

// Methods configures which methods need a key. The zero value is the
// default: POST and PATCH required, PUT and DELETE (and any other unsafe
// method) optional. Safe methods (GET, HEAD, OPTIONS, TRACE) always pass,
// whatever is configured: they must not have side effects, and storing
// their answers would serve stale reads.
type Methods struct {
	// Required lists the methods that must carry a key; nil means POST,
	// PATCH. An empty non-nil list requires none.
	Required []string
	// Optional lists the methods that are protected when they carry a key;
	// nil means every unsafe method not in Required.
	Optional []string
}

// DefaultRequired are the methods that must carry a key by default: the
// ones RFC 9110 does not define as idempotent.
var DefaultRequired = []string{http.MethodPost, http.MethodPatch}

// SafeMethod reports whether m is a safe method, which is never claimed.
func SafeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// For returns the requirement of method.
func (m Methods) For(method string) Requirement {
	method = strings.ToUpper(method)
	if SafeMethod(method) {
		return Pass
	}
	req := m.Required
	if req == nil {
		req = DefaultRequired
	}
	if slices.Contains(req, method) {
		return Required
	}
	if m.Optional == nil || slices.Contains(m.Optional, method) {
		return Optional
	}
	return Pass
}

// KeyFor applies the header rules and the method's requirement to a
// request: it returns the parsed key and whether the request is protected.
// A request that is not protected goes to the handler as is. A required
// method without a key gives CodeKeyMissing; a malformed key gives
// CodeInvalidKey even on an optional method (a caller who sends a key
// expects protection).
func (m Methods) KeyFor(r *http.Request) (key string, protected bool, err error) {
	need := m.For(r.Method)
	if need == Pass {
		return "", false, nil
	}
	key, err = ParseKey(r.Header.Values(HeaderKey))
	if err != nil {
		return "", false, err
	}
	if key == "" {
		if need == Required {
			return "", false, &Error{Code: CodeKeyMissing, Detail: r.Method + " requires an " + HeaderKey + " header"}
		}
		return "", false, nil
	}
	return key, true, nil
}

// StoreStatus reports whether an answer with status is stored (and then
// replayed) or the key released. Every status is stored by default, 5xx
// included (Stripe's behaviour: a 5xx may come after a side effect, and a
// replay must not hide it behind a second run); with store5xx false a 5xx
// releases the key so that the retry runs the handler again.
func StoreStatus(status int, store5xx bool) bool {
	return status < 500 || store5xx
}

// StorableStatus reports whether idem can store an answer of status: its
// complete takes 100–599 (openapi.yaml, StoredResponse.status), while
// net/http lets a handler answer anything from 100 to 999 and Node.js and
// WSGI servers send what they are given. The handler of such an answer
// has run, whatever it did has happened: a front door sends the answer as
// it is and stores it as not replayable (HeaderNotReplayable, status
// UnstorableStatus), as one too large to store, so that a retry is 409
// response_not_replayable instead of a second run once the claim's lease
// is over. StoreStatus does not apply to it: released, the key would run
// the handler again.
func StorableStatus(status int) bool {
	return status >= 100 && status <= 599
}

// UnstorableStatus is the status recorded for an answer whose own status
// idem cannot store (see StorableStatus): 502, the handler gave an answer
// that is not valid for the contract. Its replay is 409
// response_not_replayable all the same; the record's
// HeaderNotReplayable value names the status that was sent.
const UnstorableStatus = http.StatusBadGateway

// Unstorable returns what a front door stores, with no body, in place of
// an answer whose status idem cannot store (see StorableStatus):
// UnstorableStatus and the HeaderNotReplayable header naming the status
// sent, so that a replay answers CodeResponseNotReplayable. Every Go front
// door records such an answer with it, whatever its size.
func Unstorable(status int) (int, map[string]string) {
	return UnstorableStatus, map[string]string{
		HeaderNotReplayable: "response of status " + strconv.Itoa(status) + " not stored (outside 100-599)",
	}
}

// DefaultStoredHeaders are the response headers stored and replayed by
// default: the ones that describe the representation, and the CORS
// answer headers with Vary, without which a browser refuses to hand a
// replay to the page that sent the retry (the origin is the caller's, and
// the stored record is only ever replayed to a request with the same key
// and fingerprint in the same scope). Per-caller headers (Set-Cookie above
// all) are left out.
var DefaultStoredHeaders = []string{
	"Content-Type", "Content-Language", "Content-Disposition", "Content-Encoding",
	"Location", "ETag", "Last-Modified", "Cache-Control",
	"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Expose-Headers", "Vary",
}

// StoredHeaders returns the headers of h to store: those named in allow
// (nil means DefaultStoredHeaders), looked up case-insensitively and kept
// under the name as allow spells it, several values of one name joined
// with ", ". Set-Cookie is never stored, even when allowed. A value's bytes
// are stored as Latin-1 text (each byte one character, as the Python and
// Node.js front doors see header values), so that a value that is not
// UTF-8 (obs-text) survives the JSON of the contract; WriteReplay turns it
// back into the same bytes.
func StoredHeaders(h http.Header, allow []string) map[string]string {
	if allow == nil {
		allow = DefaultStoredHeaders
	}
	out := make(map[string]string, len(allow))
	for _, name := range allow {
		if strings.EqualFold(name, "Set-Cookie") {
			continue
		}
		if v := h.Values(name); len(v) > 0 {
			out[name] = latin1Text(strings.Join(v, ", "))
		}
	}
	return out
}

// latin1Text reads the bytes of v as Latin-1: each byte the character of
// the same number.
func latin1Text(v string) string {
	for i := 0; i < len(v); i++ {
		if v[i] >= utf8.RuneSelf {
			var b strings.Builder
			b.Grow(len(v) + len(v) - i)
			for j := 0; j < len(v); j++ {
				b.WriteRune(rune(v[j]))
			}
			return b.String()
		}
	}
	return v
}

// latin1Bytes undoes latin1Text: the bytes of a stored header value whose
// characters are all Latin-1, v itself (its UTF-8) when one is not (a
// value stored through the API by other means).
func latin1Bytes(v string) string {
	ascii := true
	for _, r := range v {
		if r > 0xFF {
			return v
		}
		if r >= utf8.RuneSelf {
			ascii = false
		}
	}
	if ascii {
		return v
	}
	b := make([]byte, 0, len(v))
	for _, r := range v {
		b = append(b, byte(r))
	}
	return string(b)
}

// HeaderNotReplayable is the header a front door stores, in place of a
// body, on a record whose response it sent but could not keep (too large,
// or a status idem cannot store: Unstorable): a replay of such a record
// answers CodeResponseNotReplayable instead of running the request again.
// Its value says why, for operators ("response of N bytes not stored").
const HeaderNotReplayable = "Idem-Not-Replayable"

// WriteReplay writes a stored response: its status, stored headers (the
// bytes StoredHeaders stored) and body verbatim, marked with Idempotent-Replayed: true. A record stored
// without its body (HeaderNotReplayable) answers CodeResponseNotReplayable.
func WriteReplay(w http.ResponseWriter, r *http.Request, status int, headers map[string]string, body []byte) {
	if _, ok := headers[HeaderNotReplayable]; ok {
		WriteProblem(w, r, &Error{Code: CodeResponseNotReplayable, Detail: NotReplayableDetail})
		return
	}
	h := w.Header()
	for k, v := range headers {
		h.Set(k, latin1Bytes(v))
	}
	h.Set(HeaderReplayed, "true")
	h.Set("Content-Length", itoa(len(body)))
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// HeaderPreferenceApplied answers a request whose Prefer: wait=N was
// honoured (RFC 7240): "wait=<seconds applied>".
const HeaderPreferenceApplied = "Preference-Applied"

// PreferWait returns N of the first "wait=N" preference in the Prefer
// header fields (RFC 7240 §4.3), or -1. Preferences are hints: a malformed
// or unknown one is ignored, never refused. The idem API, the gateway and
// client/idemhttp read it the same way; each caps N by its own limits.
func PreferWait(fields []string) int {
	for _, f := range fields {
		for pref := range strings.SplitSeq(f, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, value, ok := strings.Cut(pref, "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(value), `"`))
			if err != nil || n < 0 {
				return -1
			}
			return n
		}
	}
	return -1
}
