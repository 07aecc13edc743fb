package runtime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// startTimeout bounds how long a sandbox may take from `runc run` to its runner's readiness byte.
const startTimeout = 30 * time.Second

// Sandbox is one running container whose runner waits for exactly one run.
type Sandbox struct {
	ID       string
	Language Language
	Limits   Limits

	rt      *Runtime
	cmd     *exec.Cmd
	stdin   *os.File
	results *os.File
	stdout  *capture
	stderr  *capture

	runcStderr *capped // the runtime's own error output

	exited   chan struct{} // closed once the runtime process (and so the container) is gone
	exitCode int           // valid after exited is closed
	killOnce sync.Once
	killed   atomic.Bool // set by Kill before it signals
	used     bool
}

// Start creates a sandbox for lang and waits until its runner is ready for a run.
func (r *Runtime) Start(ctx context.Context, lang Language, limits Limits) (*Sandbox, error) {
	if !lang.Valid() {
		return nil, fmt.Errorf("runtime: unknown language %q", lang)
	}
	if err := limits.Validate(); err != nil {
		return nil, fmt.Errorf("runtime: %w", err)
	}
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil, errors.New("runtime: shutting down")
	}
	r.mu.Unlock()

	id := NewID()
	bundle := r.bundleDir(id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("runtime: bundle dir: %w", err)
	}
	spec := r.buildSpec(bundleSpec{
		ID:     id,
		Args:   r.interpreterArgs(lang),
		Env:    []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8", "TMPDIR=/tmp"},
		Limits: limits,
		Binds:  r.binds,
	})
	cfgJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("runtime: encode spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfgJSON, 0o600); err != nil {
		return nil, fmt.Errorf("runtime: write spec: %w", err)
	}

	s := &Sandbox{ID: id, Language: lang, Limits: limits, rt: r, exited: make(chan struct{})}
	var pipes []*os.File // the child's ends, closed in this process once the child has them
	closeAll := func(fs ...*os.File) {
		for _, f := range fs {
			if f != nil {
				f.Close()
			}
		}
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("runtime: pipe: %w", err)
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW)
		return nil, fmt.Errorf("runtime: pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW, resR, resW)
		return nil, fmt.Errorf("runtime: pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW, resR, resW, outR, outW)
		return nil, fmt.Errorf("runtime: pipe: %w", err)
	}
	pipes = []*os.File{stdinR, resW, outW, errW}

	// `runc run` in the foreground removes the container, cgroups included, when its init exits. Its
	// own stdio it would copy through goroutines of its own, which reorders output against the answer
	// on fd 3; so the sandbox's stdin, stdout and stderr are passed as extra descriptors instead (fds 4,
	// 5 and 6, made 0, 1 and 2 by the init wrapper) and reach the runner untouched. runc's own messages
	// go to its log file and to runcStderr.
	cmd := r.runtimeCmd(context.Background(), "--log", filepath.Join(bundle, "runtime.log"), "run",
		"--bundle", bundle, "--preserve-fds", "4", id)
	s.runcStderr = &capped{limit: 16 << 10}
	cmd.Stderr = s.runcStderr
	cmd.ExtraFiles = []*os.File{resW, stdinR, outW, errW} // fds 3, 4, 5, 6 in the container
	// Its own process group, so a signal to sandboxd's group (Ctrl-C) does not reach it: sandboxd
	// decides when sandboxes die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		closeAll(append(pipes, stdinW, resR, outR, errR)...)
		os.RemoveAll(bundle)
		return nil, errors.New("runtime: shutting down")
	}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		closeAll(append(pipes, stdinW, resR, outR, errR)...)
		os.RemoveAll(bundle)
		return nil, fmt.Errorf("runtime: start %s: %w", r.cfg.RuntimePath, err)
	}
	r.live[id] = s
	r.wg.Add(1)
	r.mu.Unlock()
	r.alive.Add(1)
	closeAll(pipes...)

	s.cmd, s.stdin, s.results = cmd, stdinW, resR
	s.stdout = newCapture(outR, limits.StdoutBytes)
	s.stderr = newCapture(errR, limits.StderrBytes)
	go s.wait()

	// Readiness: the runner writes one byte once the interpreter has loaded it.
	ready := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := io.ReadFull(resR, b[:])
		if err == nil && b[0] != 'R' {
			err = fmt.Errorf("unexpected readiness byte %q", b[0])
		}
		ready <- err
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = fmt.Errorf("not ready after %s", startTimeout)
	}
	if err != nil {
		s.Kill()
		<-s.exited
		logTail, _ := os.ReadFile(filepath.Join(bundle, "runtime.log"))
		return nil, fmt.Errorf("runtime: sandbox %s did not start: %w (stderr: %q, runtime: %q, runtime log: %q)",
			id, err, tail(s.stderr.String(), 512), tail(s.runcStderr.String(), 512), tail(string(logTail), 512))
	}
	return s, nil
}

// wait reaps the runtime process and cleans up after it.
func (s *Sandbox) wait() {
	err := s.cmd.Wait()
	s.exitCode = 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		s.exitCode = ee.ExitCode()
	} else if err != nil {
		s.exitCode = -1
	}
	// `runc run` removes the container when its init exits. If runc itself died first, its state
	// (and maybe processes and cgroups) remain: force-delete them.
	if _, err := os.Stat(filepath.Join(s.rt.stateDir(), s.ID)); err == nil {
		if out, err := s.rt.runtimeCmd(context.Background(), "delete", "--force", s.ID).CombinedOutput(); err != nil {
			s.rt.log.Warn("force-delete sandbox", zap.String("sandbox", s.ID), zap.Error(err), zap.ByteString("output", out))
		}
	}
	s.stdin.Close()
	os.RemoveAll(s.rt.bundleDir(s.ID))
	s.rt.mu.Lock()
	delete(s.rt.live, s.ID)
	s.rt.mu.Unlock()
	s.rt.alive.Add(-1)
	close(s.exited)
	s.rt.wg.Done()
}

// Exited reports whether the sandbox has ended.
func (s *Sandbox) Exited() bool {
	select {
	case <-s.exited:
		return true
	default:
		return false
	}
}

// Done is closed once the sandbox and everything of it is gone.
func (s *Sandbox) Done() <-chan struct{} { return s.exited }

// Kill ends the sandbox: SIGKILL to its init, which takes every process of its pid namespace along.
// It does not wait; use Done.
func (s *Sandbox) Kill() {
	s.killOnce.Do(func() {
		s.killed.Store(true)
		if s.Exited() {
			return
		}
		out, err := s.rt.runtimeCmd(context.Background(), "kill", s.ID, "KILL").CombinedOutput()
		if err != nil && !s.Exited() {
			// Not started far enough to be known to the runtime, or already stopping: end the runtime
			// process itself; wait() then force-deletes whatever state it left.
			s.rt.log.Debug("runtime kill failed; killing the runtime process", zap.String("sandbox", s.ID), zap.Error(err), zap.ByteString("output", out))
			_ = s.cmd.Process.Kill()
		}
	})
}

// Release ends an unused sandbox gracefully: EOF on stdin tells its runner to exit.
func (s *Sandbox) Release() {
	s.stdin.Close()
	go func() {
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			s.Kill()
		}
	}()
}

// RunRequest is one run of user code.
type RunRequest struct {
	Source  string
	State   json.RawMessage // a JSON object or null
	Timeout time.Duration
}

// RunError describes a failure of the user's code.
type RunError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Stack   string `json:"stack"`
}

// RunResult is the outcome of a run. A failure of the user's code is OK=false with Error set.
type RunResult struct {
	OK              bool
	Result          json.RawMessage
	Error           *RunError
	State           json.RawMessage
	Stdout          string
	Stderr          string
	StdoutTruncated bool
	StderrTruncated bool
	TimedOut        bool
	Duration        time.Duration
	// Outcome is a short label for metrics: ok, error, timeout, oom, exited, too_large, canceled.
	Outcome string
}

// runnerAnswer is what a runner writes to fd 3.
type runnerAnswer struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  *RunError       `json:"error"`
	State  json.RawMessage `json:"state"`
}

// Run executes one request in the sandbox. A sandbox serves one run only, and is gone when Run returns
// (or shortly after: its removal by the runtime finishes in the background; see Done).
func (s *Sandbox) Run(ctx context.Context, req RunRequest) (*RunResult, error) {
	if s.used {
		return nil, errors.New("runtime: sandbox already used")
	}
	s.used = true
	payload, err := json.Marshal(struct {
		Source string          `json:"source"`
		State  json.RawMessage `json:"state,omitempty"`
	}{req.Source, req.State})
	if err != nil {
		s.Kill()
		return nil, fmt.Errorf("runtime: encode request: %w", err)
	}

	start := time.Now()
	go func() {
		// A runner that died early makes this fail with EPIPE; the missing answer reports it.
		_, _ = s.stdin.Write(payload)
		s.stdin.Close()
	}()
	answerCh := make(chan []byte, 1)
	go func() {
		// The answer is one line. Read it byte-bounded: a line longer than the limit is refused
		// without buffering the rest.
		limit := s.Limits.ResultBytes + 2*s.Limits.StateBytes + 64<<10
		br := bufio.NewReaderSize(s.results, 64<<10)
		var line []byte
		for {
			chunk, err := br.ReadSlice('\n')
			line = append(line, chunk...)
			if len(line) > limit {
				s.Kill() // the rest would never be read
				answerCh <- []byte("too large")
				return
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil { // EOF before a complete line: the runner died
				line = nil
			}
			break
		}
		answerCh <- line
	}()

	res := &RunResult{}
	var raw []byte
	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	select {
	case raw = <-answerCh:
		res.Duration = time.Since(start)
	case <-timer.C:
		res.Duration = time.Since(start)
		res.TimedOut = true
		s.Kill()
	case <-ctx.Done():
		res.Duration = time.Since(start)
		s.Kill()
		<-s.exited
		return nil, fmt.Errorf("runtime: run canceled: %w", ctx.Err())
	}

	// The runner flushes its stdout and stderr before it writes the answer, so once the answer is in,
	// everything it printed is in the pipes or already read: drain what is buffered and answer now,
	// without waiting for the sandbox to exit. Output written after the answer (by background children
	// the end of the sandbox is about to kill) is not part of the run. A sandbox that has not exited by
	// KillGrace is killed.
	s.stdout.finish()
	s.stderr.finish()
	if !s.Exited() {
		go func() {
			select {
			case <-s.exited:
			case <-time.After(s.rt.cfg.KillGrace):
				s.Kill()
			}
		}()
	}
	res.Stdout, res.StdoutTruncated = s.stdout.result()
	res.Stderr, res.StderrTruncated = s.stderr.result()

	switch {
	case res.TimedOut:
		res.Outcome = "timeout"
		res.Error = &RunError{Type: "Timeout", Message: fmt.Sprintf("the run did not finish within %d ms", req.Timeout.Milliseconds())}
	case string(raw) == "too large":
		res.Outcome = "too_large"
		res.Error = &RunError{Type: "ResultTooLarge", Message: fmt.Sprintf("the answer exceeds %d bytes of result and %d bytes of state", s.Limits.ResultBytes, s.Limits.StateBytes)}
	case len(raw) == 0:
		// No answer: the runner died. Wait for the runtime's verdict on how.
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			s.Kill()
			<-s.exited
		}
		if s.exitCode == 137 && !s.killed.Load() {
			res.Outcome = "oom"
			res.Error = &RunError{Type: "OutOfMemory", Message: fmt.Sprintf("the sandbox was killed for exceeding its memory limit of %d bytes", s.Limits.MemoryBytes)}
		} else {
			res.Outcome = "exited"
			res.Error = &RunError{Type: "ProcessExited", Message: fmt.Sprintf("the program ended (exit status %d) before returning a result", s.exitCode)}
		}
	default:
		parseAnswer(raw, s.Limits, res)
	}
	if !res.OK {
		res.Result = nil
	}
	return res, nil
}

// parseAnswer fills res from a runner's answer line, enforcing the result and state limits.
func parseAnswer(raw []byte, limits Limits, res *RunResult) {
	var ans runnerAnswer
	if err := json.Unmarshal(raw, &ans); err != nil {
		res.Outcome = "error"
		res.Error = &RunError{Type: "ProtocolError", Message: "the runner's answer is not valid JSON (did the program write to the answer descriptor?)"}
		return
	}
	res.OK, res.Result, res.Error, res.State = ans.OK, ans.Result, ans.Error, ans.State
	res.Outcome = "ok"
	if !res.OK {
		res.Outcome = "error"
		if res.Error == nil {
			res.Error = &RunError{Type: "Error", Message: "the run failed without details"}
		}
	}
	if len(res.Result) > limits.ResultBytes {
		res.OK, res.Result, res.Outcome = false, nil, "too_large"
		res.Error = &RunError{Type: "ResultTooLarge", Message: fmt.Sprintf("the result is %d bytes of JSON; the limit is %d", len(ans.Result), limits.ResultBytes)}
	}
	if len(res.State) > limits.StateBytes {
		res.OK, res.State, res.Outcome = false, nil, "too_large"
		res.Error = &RunError{Type: "StateTooLarge", Message: fmt.Sprintf("the state is %d bytes of JSON; the limit is %d", len(ans.State), limits.StateBytes)}
	}
	if !res.OK {
		res.Result = nil
	}
}

// capture reads a pipe until EOF or finish, keeping at most limit bytes.
type capture struct {
	f         *os.File
	mu        sync.Mutex
	buf       bytes.Buffer
	limit     int
	truncated bool
	done      chan struct{}
}

func newCapture(r *os.File, limit int) *capture {
	c := &capture{f: r, limit: limit, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer r.Close()
		chunk := make([]byte, 32<<10)
		for {
			n, err := r.Read(chunk)
			if n > 0 {
				c.mu.Lock()
				room := c.limit - c.buf.Len()
				if n > room {
					c.truncated = true
					n = max(room, 0)
				}
				c.buf.Write(chunk[:n])
				c.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	return c
}

// finish stops the capture once the pipe holds no unread bytes, and waits for the reader to end. Every
// byte written to the pipe before finish was called is captured (up to the limit).
func (c *capture) finish() {
	if rc, err := c.f.SyscallConn(); err == nil {
		for range 20000 { // bounded: at most ~1s against a writer that keeps the pipe full
			select {
			case <-c.done:
				return
			default:
			}
			var n int
			var ierr error
			if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || ierr != nil || n == 0 {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	// Wake the reader, which is blocked on an empty pipe (pipes from os.Pipe are pollable, so read
	// deadlines apply). Bytes it has already taken from the pipe are appended before it returns.
	_ = c.f.SetReadDeadline(time.Now())
	<-c.done
}

func (c *capture) result() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.truncated
}

func (c *capture) String() string { s, _ := c.result(); return s }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// capped is an io.Writer that keeps the first limit bytes.
type capped struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}
