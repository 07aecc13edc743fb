package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

//go:embed runner/runner.js runner/runner.py runner/agent.py
var runnerFS embed.FS

// Runtime starts and stops sandboxes through an OCI runtime binary.
type Runtime struct {
	cfg   Config
	log   *zap.Logger
	binds map[string]string // extra read-only binds for non-merged-/usr hosts

	alive   atomic.Int64
	wg      sync.WaitGroup // one per runtime process still running
	mu      sync.Mutex
	live    map[string]*Sandbox
	closing bool
}

// New prepares the runtime's directories and assets and checks that the runtime binary and the
// interpreters exist. Containers a previous process left behind are removed by Sweep, whose caller
// knows which of them (durable sessions) to keep.
func New(ctx context.Context, cfg Config, log *zap.Logger) (*Runtime, error) {
	cfg.setDefaults()
	if cfg.Dir == "" {
		return nil, errors.New("runtime: Dir is required")
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	path, err := exec.LookPath(cfg.RuntimePath)
	if err != nil {
		return nil, fmt.Errorf("runtime: OCI runtime %q not found (install it: apt-get install -y runc): %w", cfg.RuntimePath, err)
	}
	cfg.RuntimePath = path
	for _, p := range []string{cfg.NodePath, cfg.PythonPath} {
		if !strings.HasPrefix(p, "/usr/") {
			return nil, fmt.Errorf("runtime: interpreter %s must live under /usr, the only host tree sandboxes see", p)
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("runtime: interpreter missing (apt-get install -y nodejs python3): %w", err)
		}
	}
	// Session sandboxes are started detached: when `runc run --detach` exits, their init is
	// reparented to the nearest child subreaper. Be that subreaper, so sandboxd reaps the inits it
	// stops instead of leaving zombies to a host init that may not reap.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("runtime: become child subreaper: %w", err)
	}
	r := &Runtime{cfg: cfg, log: log, live: map[string]*Sandbox{}}
	if err := r.prepareAssets(); err != nil {
		return nil, err
	}
	return r, nil
}

// Limits returns the default limits of this runtime's sandboxes.
func (r *Runtime) Limits() Limits { return r.cfg.Limits }

// Alive returns how many sandboxes (warm or running) exist now.
func (r *Runtime) Alive() int64 { return r.alive.Load() }

func (r *Runtime) assetsDir() string { return filepath.Join(r.cfg.Dir, "assets") }
func (r *Runtime) stateDir() string  { return filepath.Join(r.cfg.Dir, "state") }
func (r *Runtime) bundleDir(id string) string {
	return filepath.Join(r.cfg.Dir, "bundles", id)
}

// prepareAssets (re)writes what sandboxes see besides the host's /usr: a rootfs skeleton of empty
// mount points and merged-/usr symlinks, a generated /etc with no host secrets, and the runners.
func (r *Runtime) prepareAssets() error {
	// Running sessions (kept across restarts) have these directories bind-mounted: update files in
	// place, by rename, and never replace a directory, or they would lose their view of it.
	assets := r.assetsDir()
	rootfs := filepath.Join(assets, "rootfs")
	for _, d := range []string{"usr", "etc", "proc", "dev", "tmp", "workspace", "opt/porthole", "run/porthole", "sys"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return fmt.Errorf("runtime: rootfs skeleton: %w", err)
		}
	}
	// runc gives a tmpfs the mode of the directory it is mounted on, whatever the mount options say.
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		return fmt.Errorf("runtime: rootfs skeleton: %w", err)
	}
	r.binds = map[string]string{}
	for _, name := range hostRootLinks {
		host := "/" + name
		fi, err := os.Lstat(host)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(host)
			if err != nil {
				return fmt.Errorf("runtime: read %s: %w", host, err)
			}
			if !strings.HasPrefix(filepath.Clean(filepath.Join("/", target)), "/usr/") {
				continue // points outside /usr: not something a sandbox should see
			}
			link := filepath.Join(rootfs, name)
			if cur, err := os.Readlink(link); err == nil && cur == target {
				continue
			}
			_ = os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				return fmt.Errorf("runtime: rootfs link %s: %w", name, err)
			}
		} else if fi.IsDir() {
			if err := os.MkdirAll(filepath.Join(rootfs, name), 0o755); err != nil {
				return fmt.Errorf("runtime: rootfs dir %s: %w", name, err)
			}
			r.binds[host] = host
		}
	}
	etc := filepath.Join(assets, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("runtime: etc: %w", err)
	}
	files := map[string]string{
		"passwd":        fmt.Sprintf("root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:%d:%d:sandbox:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", r.cfg.UID, r.cfg.GID),
		"group":         fmt.Sprintf("root:x:0:\nsandbox:x:%d:\nnogroup:x:65534:\n", r.cfg.GID),
		"hosts":         "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":      "sandbox\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
		"resolv.conf":   "# no network: sandboxes have loopback only\n",
	}
	for name, body := range files {
		if err := writeFileAtomic(filepath.Join(etc, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("runtime: etc/%s: %w", name, err)
		}
	}
	runner := filepath.Join(assets, "runner")
	if err := os.MkdirAll(runner, 0o755); err != nil {
		return fmt.Errorf("runtime: runner dir: %w", err)
	}
	for _, name := range []string{"runner.js", "runner.py", "agent.py"} {
		b, err := runnerFS.ReadFile("runner/" + name)
		if err != nil {
			return fmt.Errorf("runtime: embedded %s: %w", name, err)
		}
		if err := writeFileAtomic(filepath.Join(runner, name), b, 0o644); err != nil {
			return fmt.Errorf("runtime: write %s: %w", name, err)
		}
	}
	for _, d := range []string{r.stateDir(), filepath.Join(r.cfg.Dir, "bundles")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
	}
	return nil
}

// writeFileAtomic replaces path's content by rename, so a reader never sees a partial file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// runtimeCmd builds an invocation of the OCI runtime with our state root.
func (r *Runtime) runtimeCmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.cfg.RuntimePath, append([]string{"--root", r.stateDir()}, args...)...)
}

// Sweep force-deletes every container in our state root that this process did not start and keep
// does not claim (keep may be nil): ephemeral sandboxes of a previous process serve nobody (their
// pipes ended with it), while durable sessions are kept for re-adoption. It returns the removed ids.
func (r *Runtime) Sweep(ctx context.Context, keep func(id string) bool) ([]string, error) {
	ids, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, id := range ids {
		r.mu.Lock()
		_, mine := r.live[id]
		r.mu.Unlock()
		if mine || (keep != nil && keep(id)) {
			continue
		}
		removed = append(removed, id)
		r.log.Info("removing sandbox with no owner", zap.String("sandbox", id))
		// Kill, reap (sandboxd is the subreaper of detached inits) and delete.
		if err := r.StopSession(ctx, id); err != nil {
			r.log.Warn("remove leftover sandbox", zap.String("sandbox", id), zap.Error(err))
		}
		if err := r.removeSessionFiles(id); err != nil {
			r.log.Warn("remove leftover session files", zap.String("sandbox", id), zap.Error(err))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(r.cfg.Dir, "bundles"))
	for _, e := range entries {
		r.mu.Lock()
		_, mine := r.live[e.Name()]
		r.mu.Unlock()
		if !mine {
			_ = os.RemoveAll(filepath.Join(r.cfg.Dir, "bundles", e.Name()))
		}
	}
	return removed, nil
}

// Container is what the OCI runtime reports of one container.
type Container struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// Containers lists the containers the OCI runtime knows in our state root. A listing can fail while
// a container is being deleted; it is retried a few times.
func (r *Runtime) Containers(ctx context.Context) ([]Container, error) {
	var lastErr error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
		}
		out, err := r.runtimeCmd(ctx, "list", "--format", "json").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
			}
			lastErr = err
			continue
		}
		var list []Container
		if t := bytes.TrimSpace(out); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
			if err := json.Unmarshal(out, &list); err != nil {
				return nil, fmt.Errorf("runtime: parse container list: %w", err)
			}
		}
		return list, nil
	}
	return nil, fmt.Errorf("runtime: list containers: %w", lastErr)
}

// List returns the ids of the containers the OCI runtime knows in our state root.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	list, err := r.Containers(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list))
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// NewID returns a sandbox id: 128 random bits as 26 characters of lowercase base32 ([a-z2-7]), so it
// fits a DNS label and never needs escaping.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err)) // the kernel's RNG does not fail on Linux
	}
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// initWrapper makes the descriptors sandboxd passes (4, 5, 6) the init's stdin, stdout and stderr,
// closes the originals, and execs the runner, which so becomes pid 1 of the sandbox.
var initWrapper = []string{"/bin/sh", "-c", `exec "$@" <&4 >&5 2>&6 4<&- 5>&- 6>&-`, "sh"}

// interpreterArgs is the init command of a sandbox of one language.
func (r *Runtime) interpreterArgs(lang Language) []string {
	switch lang {
	case Python:
		// -I: ignore PYTHON* variables and the user site; -u: unbuffered, so output interleaves as written.
		return append(initWrapper[:len(initWrapper):len(initWrapper)], r.cfg.PythonPath, "-I", "-u", RunnerDir+"/runner.py")
	default:
		return append(initWrapper[:len(initWrapper):len(initWrapper)], r.cfg.NodePath, RunnerDir+"/runner.js")
	}
}

// Close kills every sandbox and waits until the runtime has removed them.
func (r *Runtime) Close() {
	r.mu.Lock()
	r.closing = true
	live := make([]*Sandbox, 0, len(r.live))
	for _, s := range r.live {
		live = append(live, s)
	}
	r.mu.Unlock()
	for _, s := range live {
		s.Kill()
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		r.log.Error("sandboxes still running 30s after close")
	}
}

// SandboxUser returns the uid and gid sandboxed code runs as (files sandboxd writes into a
// workspace are given to them).
func (r *Runtime) SandboxUser() (int, int) { return int(r.cfg.UID), int(r.cfg.GID) }
