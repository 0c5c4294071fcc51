// Package launch starts the child processes of the test harnesses (the
// idem binary, the fault checker's and the scoreboard's framework apps)
// and waits until each says where it listens. One start, one kill and one
// log tail for every harness, so a fix to how a child is started or
// stopped is made once.
package launch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options says how to start a process.
type Options struct {
	// Env is the process's whole environment (see Environ); Dir its
	// working directory, "" for this one.
	Env []string
	Dir string
	// Listening returns where a line of the process's stdout or stderr
	// says it listens, or "" for any other line (IdemListening for idem).
	Listening func(line string) string
	// Timeout bounds the wait for that line; zero is 60 s.
	Timeout time.Duration
	// Group starts the process in a process group of its own, which Kill
	// kills whole: for a launcher (a framework's server) that may start
	// children.
	Group bool
	// Name names the process in errors; "" is argv[0]'s base name.
	Name string
	// Log, when set, gets a copy of everything the process writes to
	// stderr: its whole log, where Proc.Stderr keeps only the tail.
	Log io.Writer
}

// Proc is a started process.
type Proc struct {
	// Cmd is the process (Cmd.Process to signal it).
	Cmd *exec.Cmd
	// Addr is what Options.Listening returned.
	Addr  string
	group bool
	done  chan struct{}
	tail  tailBuffer
}

// Start starts argv and waits until Listening finds where it listens. A
// process that exits first, or does not say so in time, is killed and the
// error holds the tail of its stderr.
func Start(o Options, argv ...string) (*Proc, error) {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Name == "" {
		o.Name = filepath.Base(argv[0])
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = o.Env, o.Dir
	if o.Group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	p := &Proc{Cmd: cmd, group: o.Group, done: make(chan struct{})}
	outR, outW := io.Pipe()
	cmd.Stdout, cmd.Stderr = outW, io.MultiWriter(outW, &p.tail)
	if o.Log != nil {
		cmd.Stderr = io.MultiWriter(outW, &p.tail, o.Log)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		_ = outW.Close()
		close(p.done)
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			if !found {
				if a := o.Listening(sc.Text()); a != "" {
					found = true
					addr <- a
				}
			}
		}
		_, _ = io.Copy(io.Discard, outR)
	}()
	select {
	case a := <-addr:
		p.Addr = a
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before listening:\n%s", o.Name, p.Stderr())
	case <-time.After(o.Timeout):
		p.Kill()
		return nil, fmt.Errorf("%s did not listen within %s:\n%s", o.Name, o.Timeout, p.Stderr())
	}
}

// Kill sends SIGKILL (to the group with Options.Group) and waits for the
// process to exit. A nil p is a no-op, so a harness may kill what it may
// not have started.
func (p *Proc) Kill() {
	if p == nil {
		return
	}
	if p.group {
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	} else {
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stderr is the last bytes the process wrote to stderr (8 to 16 KiB), for
// a failure report.
func (p *Proc) Stderr() string { return p.tail.String() }

// IdemListening reads the address of idem's JSON "listening" log line.
func IdemListening(line string) string {
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
		return rec.Addr
	}
	return ""
}

// Environ is this process's environment without the variables that start
// with IDEM_ or with one of drop (a harness's own, e.g. "FC_"), plus env:
// a child sees only what its harness gives it.
func Environ(env map[string]string, drop ...string) []string {
	drop = append([]string{"IDEM_"}, drop...)
	var out []string
	for _, kv := range os.Environ() {
		if !hasAnyPrefix(kv, drop) {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// tailBuffer keeps the last bytes written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 16<<10 {
		t.b = append([]byte(nil), t.b[len(t.b)-8<<10:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
