package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runChecked runs src in a fresh sandbox, waits for it to be gone, and fails if anything remains.
func runChecked(t *testing.T, rt *Runtime, lang Language, src string, timeout time.Duration) *RunResult {
	t.Helper()
	ctx := context.Background()
	sb, err := rt.Start(ctx, lang, rt.Limits())
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Run(ctx, RunRequest{Source: src, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("sandbox %s still alive 30s after its run", sb.ID)
	}
	if left := rt.Remains(context.Background(), sb.ID); len(left) > 0 {
		t.Fatalf("sandbox %s left behind: %v", sb.ID, left)
	}
	return res
}

// assertHealthy proves the runtime still works after an attack.
func assertHealthy(t *testing.T, rt *Runtime) {
	t.Helper()
	res := runChecked(t, rt, Python, "return 6 * 7", 10*time.Second)
	if !res.OK || string(res.Result) != "42" {
		t.Fatalf("follow-up run failed: %+v", res)
	}
}

func TestContainment(t *testing.T) {
	rt := newTestRuntime(t)

	// A port sandboxd-like services listen on: the sandbox must not reach it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host service\n"))
			c.Close()
		}
	}()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	// A secret in the runtime's own directory (sandboxd's data dir in production).
	secret := filepath.Join(rt.cfg.Dir, "secret.txt")
	if err := os.WriteFile(secret, []byte("top secret"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		lang  Language
		src   string
		check func(t *testing.T, res *RunResult)
	}{
		{
			name: "endless loop times out",
			lang: JavaScript, src: "while (true) {}",
			check: func(t *testing.T, res *RunResult) {
				if !res.TimedOut || res.OK || res.Error.Type != "Timeout" {
					t.Fatalf("want timeout, got %+v", res)
				}
			},
		},
		{
			name: "fork bomb is bounded by the pids limit",
			lang: Python,
			src: `import os
n = 0
try:
    while True:
        if os.fork() == 0:
            import time
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    return {"forked": n, "errno": e.errno}`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("want the fork failure reported by the program, got %+v", res)
				}
				if !strings.Contains(string(res.Result), `"errno": 11`) { // EAGAIN from the pids cgroup
					t.Fatalf("want EAGAIN, got %s", res.Result)
				}
			},
		},
		{
			name: "memory bomb (8 GiB) is killed",
			lang: Python,
			src:  "b = bytearray(8 << 30)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nreturn len(b)",
			check: func(t *testing.T, res *RunResult) {
				if res.OK {
					t.Fatalf("an 8 GiB allocation succeeded: %+v", res)
				}
				if res.Error.Type != "OutOfMemory" && res.Error.Type != "MemoryError" {
					t.Fatalf("want OutOfMemory or MemoryError, got %+v", res.Error)
				}
			},
		},
		{
			name: "js memory bomb is killed",
			lang: JavaScript,
			src:  "const a = []; for (;;) { a.push(Buffer.alloc(64 << 20, 1)); }",
			check: func(t *testing.T, res *RunResult) {
				if res.OK || (res.Error.Type != "OutOfMemory" && res.Error.Type != "RangeError") {
					t.Fatalf("want OutOfMemory, got %+v", res.Error)
				}
			},
		},
		{
			name: "/tmp fill stops at its size",
			lang: Python,
			src: `import errno
written = 0
try:
    with open('/tmp/fill', 'wb') as f:
        while True:
            f.write(b'x' * (1 << 20))
            f.flush()
            written += 1
except OSError as e:
    return {"mib": written, "errno": e.errno}`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || !strings.Contains(string(res.Result), `"errno": 28`) { // ENOSPC
					t.Fatalf("want ENOSPC, got %+v %s", res.Error, res.Result)
				}
				if strings.Contains(string(res.Result), `"mib": 0,`) {
					t.Fatalf("nothing could be written to /tmp: %s", res.Result)
				}
			},
		},
		{
			name: "/workspace fill stops at its size",
			lang: JavaScript,
			src: `const fs = require('fs');
let mib = 0;
try { for (;;) { fs.appendFileSync('/workspace/fill', Buffer.alloc(1 << 20, 120)); mib++; } }
catch (e) { return { mib, code: e.code }; }`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || !strings.Contains(string(res.Result), `"code":"ENOSPC"`) || strings.Contains(string(res.Result), `"mib":0,`) {
					t.Fatalf("want ENOSPC after some writes, got %+v %s", res.Error, res.Result)
				}
			},
		},
		{
			name: "open files stop at the rlimit",
			lang: Python,
			src: `import resource
fs = []
try:
    while True:
        fs.append(open("/dev/null"))
except OSError as e:
    return {"opened": len(fs), "errno": e.errno, "limit": resource.getrlimit(resource.RLIMIT_NOFILE)}`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || !strings.Contains(string(res.Result), `"errno": 24`) || !strings.Contains(string(res.Result), `"limit": [1024, 1024]`) {
					t.Fatalf("want EMFILE at 1024, got %+v %s", res.Error, res.Result)
				}
			},
		},
		{
			name: "writes outside /tmp and /workspace fail",
			lang: Python,
			src: `import os
out = {}
for p in ["/usr/evil", "/etc/evil", "/evil", "/opt/porthole/evil", "/dev/shm/../evil", "/proc/evil"]:
    try:
        open(p, "w").write("x")
        out[p] = "written"
    except OSError as e:
        out[p] = e.errno
for p in ["/tmp/ok", "/workspace/ok"]:
    open(p, "w").write("x")
    out[p] = "written"
return out`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("%+v", res.Error)
				}
				if n := strings.Count(string(res.Result), `"written"`); n != 2 {
					t.Fatalf("want exactly /tmp and /workspace writable, got %s", res.Result)
				}
			},
		},
		{
			name: "host secrets are invisible",
			lang: Python,
			src: fmt.Sprintf(`import os
out = {}
for p in ["/etc/shadow", "/root", "/root/.bashrc", %q, %q, "/proc/1/root/etc/shadow", "/sys/fs/cgroup"]:
    out[p] = os.path.exists(p)
out["etc"] = sorted(os.listdir("/etc"))
out["uid"] = os.getuid()
return out`, secret, rt.cfg.Dir),
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("%+v", res.Error)
				}
				if strings.Contains(string(res.Result), "true") {
					t.Fatalf("a host path is visible: %s", res.Result)
				}
				if strings.Contains(string(res.Result), `"shadow"`) || !strings.Contains(string(res.Result), `"uid": 60000`) {
					t.Fatalf("unexpected /etc or uid: %s", res.Result)
				}
			},
		},
		{
			name: "host loopback is unreachable",
			lang: JavaScript,
			src: fmt.Sprintf(`const net = require('net');
return await new Promise((resolve) => {
  const s = net.connect(%d, '127.0.0.1');
  s.on('connect', () => resolve('connected'));
  s.on('data', (d) => resolve('read ' + d));
  s.on('error', (e) => resolve(e.code));
  setTimeout(() => resolve('timeout'), 2000);
});`, hostPort),
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || string(res.Result) != `"ECONNREFUSED"` {
					t.Fatalf("want ECONNREFUSED, got %+v %s", res.Error, res.Result)
				}
			},
		},
		{
			name: "no egress and only loopback",
			lang: Python,
			src: `import socket, os
out = {"ifaces": sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else sorted(n for _, n in socket.if_nameindex())}
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    out["egress"] = "connected"
except OSError as e:
    out["egress"] = e.errno
return out`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || !strings.Contains(string(res.Result), `"ifaces": ["lo"]`) || strings.Contains(string(res.Result), "connected") {
					t.Fatalf("want loopback only and no egress, got %+v %s", res.Error, res.Result)
				}
			},
		},
		{
			name: "other processes are invisible",
			lang: Python,
			src:  `import os; return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || string(res.Result) != "[1]" {
					t.Fatalf("want only pid 1, got %+v %s", res.Error, res.Result)
				}
			},
		},
		{
			name: "denied syscalls fail with EPERM",
			lang: Python,
			src: `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, call in [
    ("unshare_user", lambda: libc.unshare(0x10000000)),
    ("unshare_net", lambda: libc.unshare(0x40000000)),
    ("mount", lambda: libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None)),
    ("ptrace", lambda: libc.ptrace(16, 1, None, None)),
    ("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0, 0)),
]:
    rc = call()
    out[name] = [rc, ctypes.get_errno()]
return out`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("%+v", res.Error)
				}
				if strings.Count(string(res.Result), "[-1, 1]") != 5 {
					t.Fatalf("want every call to fail with EPERM: %s", res.Result)
				}
			},
		},
		{
			// CVE-2024-21626 leaked host directory descriptors into containers; whatever the runc
			// version, the init must hold nothing but its pipes and the sandbox's own files.
			name: "no host descriptors leak into the sandbox",
			lang: Python,
			src: `import os
out = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        out[fd] = os.readlink("/proc/self/fd/" + fd)
    except OSError:
        pass
return out`,
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("%+v", res.Error)
				}
				var fds map[string]string
				if err := json.Unmarshal(res.Result, &fds); err != nil {
					t.Fatal(err)
				}
				for fd, target := range fds {
					if !strings.HasPrefix(target, "pipe:") && !strings.HasPrefix(target, "/proc/") && !strings.HasPrefix(target, "/dev/null") {
						t.Errorf("fd %s -> %s: not a pipe of ours", fd, target)
					}
				}
				for _, fd := range []string{"0", "1", "2", "3"} {
					if !strings.HasPrefix(fds[fd], "pipe:") {
						t.Errorf("fd %s is %q, want a pipe", fd, fds[fd])
					}
				}
			},
		},
		{
			name: "output is capped",
			lang: JavaScript,
			src:  "const line = 'x'.repeat(1023) + '\\n'; for (let i = 0; i < 3000; i++) process.stdout.write(line); return 1;",
			check: func(t *testing.T, res *RunResult) {
				if !res.OK || !res.StdoutTruncated || len(res.Stdout) != rt.cfg.Limits.StdoutBytes {
					t.Fatalf("want 1 MiB of stdout and truncated, got %d bytes, truncated=%v, %+v", len(res.Stdout), res.StdoutTruncated, res.Error)
				}
			},
		},
		{
			name: "result over the limit",
			lang: JavaScript,
			src:  "return 'x'.repeat(2 << 20);",
			check: func(t *testing.T, res *RunResult) {
				if res.OK || res.Error.Type != "ResultTooLarge" {
					t.Fatalf("want ResultTooLarge, got %+v", res.Error)
				}
			},
		},
		{
			name: "background children die with the run",
			lang: Python,
			src:  "import subprocess\nsubprocess.Popen(['sleep', '300'])\nreturn 'left a child'",
			check: func(t *testing.T, res *RunResult) {
				if !res.OK {
					t.Fatalf("%+v", res.Error)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			timeout := 10 * time.Second
			if strings.HasPrefix(tc.name, "endless") {
				timeout = time.Second
			}
			tc.check(t, runChecked(t, rt, tc.lang, tc.src, timeout))
			assertHealthy(t, rt)
		})
	}
}

// TestCgroupLimits reads the limits of a live sandbox from the host's cgroup files (v1 or v2).
func TestCgroupLimits(t *testing.T) {
	rt := newTestRuntime(t)
	sb, err := rt.Start(context.Background(), Python, rt.Limits())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sb.Release(); <-sb.Done() }()
	find := func(names ...string) (string, string) {
		var path, val string
		_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
			if err != nil || path != "" {
				return filepath.SkipDir
			}
			if d.IsDir() && d.Name() == sb.ID {
				for _, n := range names {
					if b, err := os.ReadFile(filepath.Join(p, n)); err == nil {
						path, val = filepath.Join(p, n), strings.TrimSpace(string(b))
						return filepath.SkipAll
					}
				}
			}
			return nil
		})
		return path, val
	}
	for _, c := range []struct {
		files []string
		want  []string
	}{
		{[]string{"memory.limit_in_bytes", "memory.max"}, []string{fmt.Sprint(rt.cfg.Limits.MemoryBytes)}},
		{[]string{"pids.max"}, []string{fmt.Sprint(rt.cfg.Limits.Pids)}},
		{[]string{"cpu.cfs_quota_us", "cpu.max"}, []string{"100000", "100000 100000"}},
	} {
		path, val := find(c.files...)
		if path == "" {
			t.Errorf("no cgroup file %v for sandbox %s", c.files, sb.ID)
			continue
		}
		ok := false
		for _, w := range c.want {
			ok = ok || val == w
		}
		if !ok {
			t.Errorf("%s = %q, want one of %v", path, val, c.want)
		}
	}
}
