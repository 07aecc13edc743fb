// Package e2e tests the real binaries: bin/sandboxd (and, later, bin/caddy) with runc.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/porthole-dev/porthole/internal/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "porthole-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range []string{"sandboxd", "caddy"} {
		out, err := exec.Command("go", "build", "-o", dir+"/"+b, "../cmd/"+b).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b, err, out)
			os.Exit(1)
		}
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// sandboxdCmd runs a sandboxd subcommand to completion and returns its stdout.
func sandboxdCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binDir+"/sandboxd", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("sandboxd %v: %v\n%s", args, err, stderr)
	}
	return string(out)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// daemon is a running `sandboxd serve`.
type daemon struct {
	cmd     *exec.Cmd
	url     string
	dataDir string
	logs    *syncBuffer
	exited  chan struct{} // closed once the process has exited; exitErr is then set

	exitErr error
}

func startDaemon(t *testing.T, dataDir string, extra ...string) *daemon {
	t.Helper()
	testenv.NeedRunc(t)
	addr := freePort(t)
	args := append([]string{"serve", "--listen", addr, "--data-dir", dataDir, "--preview-domain", "preview.localhost"}, extra...)
	cmd := exec.Command(binDir+"/sandboxd", args...)
	logs := &syncBuffer{}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, url: "http://" + addr, dataDir: dataDir, logs: logs, exited: make(chan struct{})}
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	go func() {
		for l := range lines {
			logs.WriteString(l + "\n")
		}
	}()
	go func() { d.exitErr = cmd.Wait(); close(d.exited) }()
	// Durable sessions outlive sandboxd by design; after the daemon is stopped (cleanups run last
	// in, first out), remove them so t.TempDir can be removed.
	t.Cleanup(func() { removeSessions(t, dataDir) })
	t.Cleanup(func() {
		// Stop it the way an operator does, so it removes its sandboxes before t.TempDir is removed.
		d.stop(t)
		if t.Failed() {
			t.Logf("sandboxd logs:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(d.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd did not become healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the daemon to exit (SIGKILL after 40s). Safe to call again, and
// after the process died otherwise.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(40 * time.Second):
		t.Errorf("sandboxd did not exit 40s after SIGTERM")
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// syncBuffer is a strings.Builder safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) WriteString(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(v)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// removeSessions force-deletes every container of a data dir and unmounts its session workspaces.
func removeSessions(t *testing.T, dataDir string) {
	root := filepath.Join(dataDir, "runtime", "state")
	for _, id := range strings.Fields(runcContainers(t, dataDir)) {
		_ = exec.Command("runc", "--root", root, "delete", "--force", id).Run()
	}
	ws, _ := filepath.Glob(filepath.Join(dataDir, "runtime", "s", "*", "workspace"))
	for _, w := range ws {
		_ = syscall.Unmount(w, syscall.MNT_DETACH)
	}
}

// runcContainers lists the containers in a sandboxd data dir's runtime root.
func runcContainers(t *testing.T, dataDir string) string {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), "runc", "--root", filepath.Join(dataDir, "runtime", "state"), "list", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("runc list: %v %s", err, out)
	}
	return strings.TrimSpace(string(out))
}
