package logsink

import (
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// accessLine is an access log line as the server writes it (~200 bytes).
var accessLine = []byte(`{"time":"2026-11-30T17:00:00.123456789Z","level":"INFO","msg":"http request","request_id":"01JDXQ4Z8K3M5N7P9R1T3V5X7Z","method":"POST","route":"/v1/keys/claim","status":201,"duration":1234567,"tenant":"bench"}` + "\n")

// lockedFile is how the server wrote before logsink: one write(2) per line
// under a mutex.
type lockedFile struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func logFile(b *testing.B) *os.File {
	f, err := os.Create(filepath.Join(b.TempDir(), "log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	return f
}

// BenchmarkSyncFile: each line written to a file with its own write(2),
// from parallel goroutines (run with -cpu to vary them).
func BenchmarkSyncFile(b *testing.B) {
	w := &lockedFile{w: logFile(b)}
	b.ReportAllocs()
	b.SetBytes(int64(len(accessLine)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = w.Write(accessLine)
		}
	})
}

// BenchmarkSinkFile: the same lines through a Writer in front of the file;
// the time includes the Close that writes the last of them.
func BenchmarkSinkFile(b *testing.B) {
	s := New(logFile(b), 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(accessLine)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = s.Write(accessLine)
		}
	})
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}
