package runtime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// A session sandbox is a long-lived container, started detached so it outlives sandboxd, whose init
// is the agent (runner/agent.py). Its host directory <Dir>/s/<id> holds:
//
//	config.json  the OCI bundle
//	run/         bound at /run/porthole: the agent's socket
//	workspace/   a size-limited tmpfs mounted on the host, bound at /workspace: it survives sandboxd
//	             restarts and a stop of the sandbox, and sandboxd reads and writes it through os.Root
//	agent.log    the agent's own stdout and stderr
//
// Nothing here depends on sandboxd's process: after a restart, sessions are found again with the
// OCI runtime's state and the agent's socket.

// ErrNotRunning is returned for a session whose sandbox is not running.
var ErrNotRunning = errors.New("session sandbox is not running")

// SessionDir is the host directory of session id.
func (r *Runtime) SessionDir(id string) string { return filepath.Join(r.cfg.Dir, "s", id) }

// WorkspacePath is the host path of a session's /workspace.
func (r *Runtime) WorkspacePath(id string) string {
	return filepath.Join(r.SessionDir(id), "workspace")
}

func (r *Runtime) agentSocket(id string) string {
	return filepath.Join(r.SessionDir(id), "run", "agent.sock")
}

// validID guards paths built from ids.
func validID(id string) bool {
	if len(id) < 16 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// StartSession starts (or resumes) session id's sandbox and waits until its agent answers. The
// workspace is created on first start and kept across stops.
func (r *Runtime) StartSession(ctx context.Context, id string, lang Language, limits Limits) error {
	if !validID(id) {
		return fmt.Errorf("runtime: invalid session id %q", id)
	}
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	dir := r.SessionDir(id)
	runDir := filepath.Join(dir, "run")
	ws := r.WorkspacePath(id)
	for _, d := range []string{runDir, ws} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("runtime: session dir: %w", err)
		}
	}
	if err := os.Chown(runDir, int(r.cfg.UID), int(r.cfg.GID)); err != nil {
		return fmt.Errorf("runtime: session run dir: %w", err)
	}
	if !isMountPoint(ws) {
		opts := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", limits.WorkspaceBytes, r.cfg.UID, r.cfg.GID)
		if err := unix.Mount("tmpfs", ws, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("runtime: mount session workspace: %w", err)
		}
	}
	// A stopped container of the same id may remain (after a crash): clear it first.
	if st, _, err := r.SessionState(ctx, id); err == nil && st != "" {
		if st == "running" {
			return r.waitAgent(ctx, id)
		}
		_ = r.runtimeCmd(ctx, "delete", "--force", id).Run()
	}
	spec := r.buildSpec(bundleSpec{
		ID:   id,
		Args: []string{r.cfg.PythonPath, "-I", "-u", RunnerDir + "/agent.py"},
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8", "TMPDIR=/tmp",
			"PORTHOLE_SESSION_LANGUAGE=" + string(lang)},
		Limits:        limits,
		Binds:         r.binds,
		WorkspaceHost: ws,
		RunHost:       runDir,
	})
	cfgJSON, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("runtime: encode spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600); err != nil {
		return fmt.Errorf("runtime: write spec: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("runtime: agent log: %w", err)
	}
	defer logf.Close()
	// Detached: the container does not depend on sandboxd or on a runtime process staying alive.
	cmd := r.runtimeCmd(ctx, "--log", filepath.Join(dir, "runtime.log"), "run", "--detach", "--bundle", dir, id)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Run(); err != nil {
		tailLog, _ := os.ReadFile(filepath.Join(dir, "runtime.log"))
		out, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
		return fmt.Errorf("runtime: start session %s: %w (output: %q; runtime log: %q)", id, err, tail(string(out), 512), tail(string(tailLog), 512))
	}
	if err := r.waitAgent(ctx, id); err != nil {
		_ = r.StopSession(context.Background(), id)
		agentLog, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
		return fmt.Errorf("%w (agent log: %q)", err, tail(string(agentLog), 512))
	}
	return nil
}

// waitAgent waits until the session's agent answers a ping.
func (r *Runtime) waitAgent(ctx context.Context, id string) error {
	deadline := time.Now().Add(startTimeout)
	for {
		var pong struct {
			OK bool `json:"ok"`
		}
		err := r.AgentCall(ctx, id, map[string]any{"op": "ping"}, &pong, 2*time.Second)
		if err == nil && pong.OK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runtime: session %s agent not ready after %s: %v", id, startTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SessionState returns the OCI runtime's status of id ("running", "stopped", "created", "paused",
// or "" when the runtime does not know it) and its init's host pid.
func (r *Runtime) SessionState(ctx context.Context, id string) (string, int, error) {
	out, err := r.runtimeCmd(ctx, "state", id).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && bytes.Contains(ee.Stderr, []byte("does not exist")) {
			return "", 0, nil
		}
		return "", 0, fmt.Errorf("runtime: state of %s: %w", id, err)
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", 0, fmt.Errorf("runtime: parse state of %s: %w", id, err)
	}
	return st.Status, st.Pid, nil
}

// StopSession kills the session's sandbox and removes the container; the workspace stays.
func (r *Runtime) StopSession(ctx context.Context, id string) error {
	st, pid, err := r.SessionState(ctx, id)
	if err != nil {
		return err
	}
	if st == "" {
		return nil
	}
	if st == "running" || st == "paused" || st == "created" {
		if out, err := r.runtimeCmd(ctx, "kill", id, "KILL").CombinedOutput(); err != nil {
			r.log.Debug("kill session", zap.String("sandbox", id), zap.Error(err), zap.ByteString("output", out))
		}
	}
	// The init was started detached; if sandboxd is its reaper (a child subreaper), reap it.
	if pid > 0 {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var ws unix.WaitStatus
			wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			if wpid == pid || errors.Is(err, unix.ECHILD) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if out, err := r.runtimeCmd(ctx, "delete", "--force", id).CombinedOutput(); err != nil {
		if st2, _, _ := r.SessionState(ctx, id); st2 != "" {
			return fmt.Errorf("runtime: delete session %s: %w (%s)", id, err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// RemoveSession stops the sandbox and removes everything of the session: workspace, socket, bundle.
func (r *Runtime) RemoveSession(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("runtime: invalid session id %q", id)
	}
	if err := r.StopSession(ctx, id); err != nil {
		return err
	}
	return r.removeSessionFiles(id)
}

func (r *Runtime) removeSessionFiles(id string) error {
	dir := r.SessionDir(id)
	ws := r.WorkspacePath(id)
	if isMountPoint(ws) {
		if err := unix.Unmount(ws, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("runtime: unmount workspace of %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("runtime: remove session dir: %w", err)
	}
	return nil
}

// SessionIDs lists the session directories on disk (sessions with files, running or not).
func (r *Runtime) SessionIDs() []string {
	entries, _ := os.ReadDir(filepath.Join(r.cfg.Dir, "s"))
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// isMountPoint reports whether path is a mount point (its device differs from its parent's).
func isMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// AgentCall sends one request to session id's agent and decodes its one-line answer (at most
// 8 MiB: the agent is inside the sandbox and not trusted).
func (r *Runtime) AgentCall(ctx context.Context, id string, req, resp any, timeout time.Duration) error {
	conn, err := r.AgentDial(ctx, id, req, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	line, err := readLine(conn.r, 8<<20)
	if err != nil {
		return fmt.Errorf("runtime: agent answer: %w", err)
	}
	var agentErr struct {
		AgentError string `json:"agentError"`
		Code       string `json:"code"`
	}
	if json.Unmarshal(line, &agentErr) == nil && agentErr.AgentError != "" {
		return &AgentError{Message: agentErr.AgentError, Code: agentErr.Code}
	}
	if err := json.Unmarshal(line, resp); err != nil {
		return fmt.Errorf("runtime: agent answer is not JSON: %w", err)
	}
	return nil
}

// AgentError is a refusal from the agent (no such process, a bad command, a limit).
type AgentError struct {
	Message string
	Code    string // "not_found", "limit", "spawn" or ""
}

func (e *AgentError) Error() string { return "agent: " + e.Message }

// AgentConn is an open request to an agent, for answers that stream (logs).
type AgentConn struct {
	net.Conn
	r *bufio.Reader
}

// Next reads the next line of the answer, at most 4 MiB.
func (c *AgentConn) Next() ([]byte, error) { return readLine(c.r, 4<<20) }

// AgentDial sends req to the agent and returns the connection to read the answer from. timeout
// bounds the whole exchange (0: none, for followers).
func (r *Runtime) AgentDial(ctx context.Context, id string, req any, timeout time.Duration) (*AgentConn, error) {
	if !validID(id) {
		return nil, fmt.Errorf("runtime: invalid session id %q", id)
	}
	conn, err := dialUnix(ctx, r.agentSocket(id))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotRunning, err)
	}
	if timeout > 0 {
		_ = conn.SetDeadline(time.Now().Add(timeout))
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	_ = stop
	b, err := json.Marshal(req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("runtime: encode agent request: %w", err)
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		conn.Close()
		return nil, fmt.Errorf("runtime: send agent request: %w", err)
	}
	return &AgentConn{Conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}, nil
}

// dialUnix connects to a unix socket. A path longer than sun_path allows (108 bytes; deep data dirs
// reach it) is reached through /proc/self/fd/N/<name> of its opened folder instead.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < 100 {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > limit {
			return nil, fmt.Errorf("line longer than %d bytes", limit)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}

// agentExecute is the agent's answer to execute.
type agentExecute struct {
	Answer          string    `json:"answer"`
	OK              bool      `json:"ok"`
	Outcome         string    `json:"outcome"`
	Error           *RunError `json:"error"`
	Stdout          string    `json:"stdout"`
	Stderr          string    `json:"stderr"`
	StdoutTruncated bool      `json:"stdoutTruncated"`
	StderrTruncated bool      `json:"stderrTruncated"`
	DurationMs      float64   `json:"durationMs"`
	TimedOut        bool      `json:"timedOut"`
}

// ExecuteInSession runs code in session id's sandbox through its agent. The answer has the shape of
// an ephemeral run; limits are enforced by the agent and checked again here.
func (r *Runtime) ExecuteInSession(ctx context.Context, id string, lang Language, req RunRequest, limits Limits) (*RunResult, error) {
	var a agentExecute
	err := r.AgentCall(ctx, id, map[string]any{
		"op": "execute", "language": lang, "source": req.Source, "state": req.State,
		"timeoutMs": req.Timeout.Milliseconds(),
		"limits": map[string]int{"stdoutBytes": limits.StdoutBytes, "stderrBytes": limits.StderrBytes,
			"resultBytes": limits.ResultBytes, "stateBytes": limits.StateBytes},
	}, &a, req.Timeout+15*time.Second)
	if err != nil {
		return nil, err
	}
	res := &RunResult{
		Stdout: truncate(a.Stdout, limits.StdoutBytes), Stderr: truncate(a.Stderr, limits.StderrBytes),
		StdoutTruncated: a.StdoutTruncated || len(a.Stdout) > limits.StdoutBytes,
		StderrTruncated: a.StderrTruncated || len(a.Stderr) > limits.StderrBytes,
		TimedOut:        a.TimedOut, Duration: time.Duration(a.DurationMs * float64(time.Millisecond)),
	}
	if a.Answer == "" {
		res.Outcome = a.Outcome
		res.Error = a.Error
		if res.Error == nil {
			res.Outcome, res.Error = "exited", &RunError{Type: "ProcessExited", Message: "the program ended before returning a result"}
		}
		switch res.Outcome {
		case "timeout", "oom", "exited", "too_large":
		default:
			res.Outcome = "exited"
		}
		return res, nil
	}
	parseAnswer([]byte(a.Answer), limits, res)
	return res, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// DialPort connects to 127.0.0.1:port inside session id's network namespace. The connection is a
// plain TCP socket that lives in the sandbox's namespace: nothing on the host can reach a sandbox
// port any other way.
func (r *Runtime) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("runtime: port %d out of range", port)
	}
	pid, err := r.initPid(id)
	if err != nil {
		return nil, err
	}
	return dialInNetns(ctx, pid, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// ListeningPorts returns the TCP ports on which something listens inside session id's network
// namespace, read from /proc/<init>/net/tcp{,6}.
func (r *Runtime) ListeningPorts(ctx context.Context, id string) ([]int, error) {
	pid, err := r.initPid(id)
	if err != nil {
		return nil, err
	}
	return listeningPorts(pid)
}

// initPid returns the host pid of a running session's init, from the OCI runtime's state file (a
// file read, not a runtime invocation: this is on the path of every preview connection). The pid is
// checked against the start time recorded with it, so a recycled pid is never taken for the init.
func (r *Runtime) initPid(id string) (int, error) {
	if !validID(id) {
		return 0, fmt.Errorf("runtime: invalid session id %q", id)
	}
	b, err := os.ReadFile(filepath.Join(r.stateDir(), id, "state.json"))
	if err != nil {
		return 0, ErrNotRunning
	}
	var st struct {
		Pid   int    `json:"init_process_pid"`
		Start uint64 `json:"init_process_start"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		return 0, ErrNotRunning
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", st.Pid))
	if err != nil {
		return 0, ErrNotRunning
	}
	// Field 22 is the start time; the command name (field 2) may contain spaces, so count from ')'.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 20 || fields[19] != strconv.FormatUint(st.Start, 10) || fields[0] == "Z" {
		return 0, ErrNotRunning
	}
	return st.Pid, nil
}

func listeningPorts(pid int) ([]int, error) {
	seen := map[int]bool{}
	var ports []int
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("runtime: read sockets: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" { // 0A: TCP_LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if !ok {
				continue
			}
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil || p == 0 || seen[int(p)] {
				continue
			}
			seen[int(p)] = true
			ports = append(ports, int(p))
		}
	}
	return ports, nil
}
