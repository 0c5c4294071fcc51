// Command goapp is the fault checker's Go app (testkit/faultcheck/PROTOCOL.md):
// a counting handler that logs every run it starts and finishes to a JSONL
// side-effect log, served plain (FC_FRONTDOOR=none, the gateway's upstream)
// or behind client/idemhttp (FC_FRONTDOOR=idemhttp). It is a test harness,
// never imported by product code.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemhttp"
)

// sideLog appends one JSON line per write to FC_LOG.
type sideLog struct {
	mu sync.Mutex
	f  *os.File
}

func (l *sideLog) write(v map[string]any) {
	b, _ := json.Marshal(v)
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.f.Write(b); err != nil {
		log.Printf("goapp: side-effect log: %v", err)
	}
}

type app struct {
	log         *sideLog
	scopeHeader string
	runs        atomic.Int64
}

func (a *app) handle(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Req  string `json:"req"`
		Mode string `json:"mode"`
		Pad  string `json:"pad"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	scope := ""
	if a.scopeHeader != "" {
		scope = r.Header.Get(a.scopeHeader)
	}
	run := fmt.Sprintf("go%d-%d", os.Getpid(), a.runs.Add(1))
	a.log.write(map[string]any{"ev": "start", "run": run, "key": r.Header.Get("Idempotency-Key"), "scope": scope,
		"req": in.Req, "mode": in.Mode, "t": time.Now().UnixMilli()})
	body, _ := json.Marshal(map[string]string{"run": run, "req": in.Req, "scope": scope, "pad": in.Pad})
	end := func(status int) {
		a.log.write(map[string]any{"ev": "end", "run": run, "status": status, "body_sha256": sha(body), "len": len(body)})
	}
	w.Header().Set("Content-Type", "application/json")
	mode, arg, _ := strings.Cut(in.Mode, ":")
	switch mode {
	case "ok":
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
		end(http.StatusCreated)
	case "slow":
		ms, _ := strconv.Atoi(arg)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
		end(http.StatusCreated)
	case "status":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 200 || n > 999 {
			http.Error(w, "bad mode", http.StatusBadRequest)
			return
		}
		w.WriteHeader(n)
		_, _ = w.Write(body)
		end(n)
	case "raise":
		a.log.write(map[string]any{"ev": "abort", "run": run, "why": "raise"})
		panic(http.ErrAbortHandler)
	case "stream", "cutstream":
		chunksS, msS, _ := strings.Cut(arg, ":")
		chunks, _ := strconv.Atoi(chunksS)
		ms := 20
		if mode == "stream" {
			ms, _ = strconv.Atoi(msS)
		}
		if chunks < 1 {
			chunks = 1
		}
		w.WriteHeader(http.StatusOK)
		for i := range chunks {
			if mode == "cutstream" && i == chunks/2 {
				a.log.write(map[string]any{"ev": "abort", "run": run, "why": "cutstream"})
				panic(http.ErrAbortHandler)
			}
			lo, hi := i*len(body)/chunks, (i+1)*len(body)/chunks
			if _, err := w.Write(body[lo:hi]); err != nil {
				a.log.write(map[string]any{"ev": "abort", "run": run, "why": "write: " + err.Error()})
				return
			}
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			if i == chunks-1 {
				break
			}
			select {
			case <-r.Context().Done():
				// What a streaming handler does when its caller is gone.
				a.log.write(map[string]any{"ev": "abort", "run": run, "why": "cancelled"})
				return
			case <-time.After(time.Duration(ms) * time.Millisecond):
			}
		}
		end(http.StatusOK)
	default:
		http.Error(w, "bad mode", http.StatusBadRequest)
	}
}

func main() {
	log.SetFlags(0)
	f, err := os.OpenFile(os.Getenv("FC_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		log.Fatalf("goapp: FC_LOG: %v", err)
	}
	a := &app{log: &sideLog{f: f}, scopeHeader: os.Getenv("FC_SCOPE_HEADER")}
	var h http.Handler = http.HandlerFunc(a.handle)
	switch fd := os.Getenv("FC_FRONTDOOR"); fd {
	case "none", "":
	case "idemhttp":
		c, err := client.New(os.Getenv("IDEM_URL"), client.WithToken(os.Getenv("IDEM_TOKEN")))
		if err != nil {
			log.Fatalf("goapp: %v", err)
		}
		opts := idemhttp.Options{ReleaseServerErrors: os.Getenv("FC_RELEASE_5XX") == "1"}
		if a.scopeHeader != "" {
			opts.Scope = func(r *http.Request) (string, error) {
				if len(r.Header.Values(a.scopeHeader)) > 1 {
					return "", errors.New("the scope header is repeated")
				}
				return r.Header.Get(a.scopeHeader), nil
			}
		}
		h = idemhttp.Middleware(c, opts)(h)
	default:
		log.Fatalf("goapp: FC_FRONTDOOR %q: want none or idemhttp", fd)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /fc/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.Handle("/fc/", h)
	ln, err := net.Listen("tcp", os.Getenv("FC_ADDR"))
	if err != nil {
		log.Fatalf("goapp: listen: %v", err)
	}
	fmt.Printf("FC_LISTENING http://%s\n", ln.Addr())
	log.Fatal((&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln))
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
