package edgeapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Forwarder gives the edge two unix sockets per listening sandbox port, which exist exactly while
// something listens on that port inside a running session:
//
//   - <dir>/<sandboxId>-<port>.sock: a byte stream. Each connection is spliced to 127.0.0.1:<port>
//     dialled inside the sandbox's network namespace. Any client can use it (Caddy's reverse_proxy
//     dials it as a plain unix upstream).
//   - <dir>/<sandboxId>-<port>.fd.sock: the same dial, but the connected TCP socket itself is passed
//     back (SCM_RIGHTS, one byte "S" with the descriptor; "E" without one if the dial failed), and
//     sandboxd steps out of the data path. The edge's porthole transport uses it.
//
// A port that is not up yet has no socket: a dial error, which reverse_proxy retries while it comes up.
type Forwarder struct {
	dir      string
	log      *zap.Logger
	sessions *session.Manager
	rt       *runtime.Runtime

	mu        sync.Mutex
	listeners map[string]net.Listener // "<id>-<port>"
}

// NewForwarder prepares dir (mode 0700: only sandboxd's user and root reach the sockets).
func NewForwarder(dir string, log *zap.Logger, sessions *session.Manager, rt *runtime.Runtime) (*Forwarder, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	return &Forwarder{dir: dir, log: log, sessions: sessions, rt: rt, listeners: map[string]net.Listener{}}, nil
}

// SocketPath is where the socket of a sandbox port is.
func SocketPath(dir, sandboxID string, port int) string {
	return filepath.Join(dir, sandboxID+"-"+strconv.Itoa(port)+".sock")
}

// Run keeps the sockets in step with the listening ports of running sessions, polling every interval.
func (f *Forwarder) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f.sync(ctx)
		select {
		case <-ctx.Done():
			f.closeAll()
			return
		case <-t.C:
		}
	}
}

func (f *Forwarder) sync(ctx context.Context) {
	all, err := f.sessions.List(ctx, "")
	if err != nil {
		return
	}
	want := map[string]bool{}
	for _, s := range all {
		if s.Status != store.StatusRunning {
			continue
		}
		ports, err := f.rt.ListeningPorts(ctx, s.ID)
		if err != nil {
			continue
		}
		for _, p := range ports {
			want[s.ID+"-"+strconv.Itoa(p)] = true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, ln := range f.listeners {
		if !want[strings.TrimSuffix(key, ".fd")] {
			ln.Close()
			delete(f.listeners, key)
		}
	}
	for key := range want {
		if _, ok := f.listeners[key]; ok {
			continue
		}
		id, portStr, _ := strings.Cut(key, "-")
		port, _ := strconv.Atoi(portStr)
		path := SocketPath(f.dir, id, port)
		_ = os.Remove(path)
		ln, err := net.Listen("unix", path)
		if err != nil {
			f.log.Warn("forward socket", zap.String("path", path), zap.Error(err))
			continue
		}
		f.listeners[key] = ln
		go f.serve(ln, id, port)
		fdPath := FDSocketPath(f.dir, id, port)
		_ = os.Remove(fdPath)
		fdLn, err := net.Listen("unix", fdPath)
		if err != nil {
			f.log.Warn("forward socket", zap.String("path", fdPath), zap.Error(err))
			continue
		}
		f.listeners[key+".fd"] = fdLn
		go f.serveFD(fdLn, id, port)
	}
}

// FDSocketPath is where the descriptor-passing socket of a sandbox port is.
func FDSocketPath(dir, sandboxID string, port int) string {
	return filepath.Join(dir, sandboxID+"-"+strconv.Itoa(port)+".fd.sock")
}

func (f *Forwarder) serveFD(ln net.Listener, id string, port int) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go f.passFD(c.(*net.UnixConn), id, port)
	}
}

// passFD dials the sandbox port and hands the connected socket to the client.
func (f *Forwarder) passFD(client *net.UnixConn, id string, port int) {
	defer client.Close()
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	upstream, err := f.dial(id, port)
	if err != nil {
		_, _ = client.Write([]byte("E"))
		return
	}
	defer upstream.Close()
	file, err := upstream.(*net.TCPConn).File()
	if err != nil {
		_, _ = client.Write([]byte("E"))
		return
	}
	defer file.Close()
	if _, _, err := client.WriteMsgUnix([]byte("S"), unix.UnixRights(int(file.Fd())), nil); err != nil {
		f.log.Debug("pass descriptor", zap.String("sandbox", id), zap.Error(err))
	}
}

// dial connects to a sandbox port inside its namespace; a connection counts as the session's activity.
func (f *Forwarder) dial(id string, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := f.rt.DialPort(ctx, id, port)
	if err != nil {
		if !errors.Is(err, runtime.ErrNotRunning) {
			f.log.Debug("dial into sandbox", zap.String("sandbox", id), zap.Int("port", port), zap.Error(err))
		}
		return nil, err
	}
	f.sessions.Touch(id)
	return conn, nil
}

func (f *Forwarder) serve(ln net.Listener, id string, port int) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go f.splice(c, id, port)
	}
}

func (f *Forwarder) splice(client net.Conn, id string, port int) {
	defer client.Close()
	upstream, err := f.dial(id, port)
	if err != nil {
		return
	}
	defer upstream.Close()
	pipe(client, upstream, nil)
}

func (f *Forwarder) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, ln := range f.listeners {
		ln.Close()
		delete(f.listeners, key)
	}
}
