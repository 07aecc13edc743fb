// Package testenv tells tests whether the machine has what they need. On a laptop without root or
// runc a test skips; under CI (CI=true) the same absence fails the test, so a green CI always means the
// test ran.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI.
func InCI() bool { return os.Getenv("CI") == "true" }

// Need skips (or, under CI, fails) the test when ok is false.
func Need(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("CI=true but this machine lacks %s: .ci/run must install it", what)
	}
	t.Skipf("needs %s", what)
}

// NeedRoot requires uid 0 (runc needs it to create namespaces and cgroups).
func NeedRoot(t testing.TB) { t.Helper(); Need(t, os.Geteuid() == 0, "root") }

// NeedBinary requires an executable in PATH or at an absolute path.
func NeedBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	Need(t, err == nil, name)
	return p
}

// NeedRunc requires root, runc and the interpreters sandboxes run.
func NeedRunc(t testing.TB) {
	t.Helper()
	NeedRoot(t)
	NeedBinary(t, "runc")
	NeedBinary(t, "/usr/bin/node")
	NeedBinary(t, "/usr/bin/python3")
}
