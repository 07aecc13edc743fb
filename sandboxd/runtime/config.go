// Package runtime runs untrusted code in OCI sandboxes started by an OCI runtime binary (runc by
// default, runsc can replace it). A sandbox is one container whose init process is a language runner
// (runner/runner.js or runner/runner.py) that serves exactly one run.
package runtime

import (
	"fmt"
	"time"
)

// Language is a language a sandbox can run.
type Language string

// The languages sandboxd runs.
const (
	JavaScript Language = "javascript"
	Python     Language = "python"
)

// Languages lists every supported language, in a stable order.
var Languages = []Language{JavaScript, Python}

// Valid reports whether l is a supported language.
func (l Language) Valid() bool { return l == JavaScript || l == Python }

// Limits bound what one sandbox may use. The zero value of a field means "use the default" only
// through DefaultLimits; Validate rejects non-positive values.
type Limits struct {
	// MemoryBytes is the cgroup memory limit of the sandbox (tmpfs pages included). Default 256 MiB.
	MemoryBytes int64 `json:"memoryBytes"`
	// Pids is the cgroup pids limit: processes and threads together. Default 128.
	Pids int64 `json:"pids"`
	// CPUs is the CPU bandwidth of the sandbox in cores (CFS quota / period). Default 1.
	CPUs float64 `json:"cpus"`
	// TmpBytes is the size of the tmpfs mounted at /tmp. Default 64 MiB.
	TmpBytes int64 `json:"tmpBytes"`
	// WorkspaceBytes is the size of the tmpfs mounted at /workspace. Default 64 MiB.
	WorkspaceBytes int64 `json:"workspaceBytes"`
	// StdoutBytes and StderrBytes bound how much output a run captures; the rest is read and dropped,
	// and the answer says it was truncated. Default 1 MiB each.
	StdoutBytes int `json:"stdoutBytes"`
	StderrBytes int `json:"stderrBytes"`
	// ResultBytes bounds the JSON of the returned value. Default 1 MiB.
	ResultBytes int `json:"resultBytes"`
	// StateBytes bounds the JSON of the state, in and out. Default 256 KiB.
	StateBytes int `json:"stateBytes"`
	// OpenFiles is RLIMIT_NOFILE inside the sandbox. Default 1024.
	OpenFiles uint64 `json:"openFiles"`
}

// DefaultLimits returns the limits documented in docs/API.md.
func DefaultLimits() Limits {
	return Limits{
		MemoryBytes:    256 << 20,
		Pids:           128,
		CPUs:           1,
		TmpBytes:       64 << 20,
		WorkspaceBytes: 64 << 20,
		StdoutBytes:    1 << 20,
		StderrBytes:    1 << 20,
		ResultBytes:    1 << 20,
		StateBytes:     256 << 10,
		OpenFiles:      1024,
	}
}

// Validate reports the first limit that is not usable.
func (l Limits) Validate() error {
	switch {
	case l.MemoryBytes < 32<<20:
		return fmt.Errorf("memory limit %d bytes is below the 32 MiB an interpreter needs", l.MemoryBytes)
	case l.Pids < 8:
		return fmt.Errorf("pids limit %d is below 8", l.Pids)
	case l.CPUs <= 0:
		return fmt.Errorf("cpus %v must be positive", l.CPUs)
	case l.TmpBytes <= 0 || l.WorkspaceBytes <= 0:
		return fmt.Errorf("tmp and workspace sizes must be positive")
	case l.StdoutBytes <= 0 || l.StderrBytes <= 0 || l.ResultBytes <= 0 || l.StateBytes <= 0:
		return fmt.Errorf("output, result and state limits must be positive")
	case l.OpenFiles < 64:
		return fmt.Errorf("open files limit %d is below 64", l.OpenFiles)
	}
	return nil
}

// Config configures a Runtime.
type Config struct {
	// RuntimePath is the OCI runtime binary. Default "runc" (looked up in PATH); "runsc" works too.
	RuntimePath string
	// Dir is where the runtime keeps its state: runtime root, bundles and the read-only assets that
	// sandboxes see (rootfs skeleton, generated /etc, runners). Required.
	Dir string
	// NodePath and PythonPath are the host interpreters, bind-mounted read-only with the rest of /usr.
	// Defaults /usr/bin/node and /usr/bin/python3.
	NodePath   string
	PythonPath string
	// UID and GID are the unprivileged ids the sandboxed process runs as. Default 60000.
	UID, GID uint32
	// Limits bound each sandbox. Default DefaultLimits().
	Limits Limits
	// CgroupParent is the cgroup (relative to sandboxd's own) under which sandboxes are placed.
	// Default "porthole".
	CgroupParent string
	// KillGrace is how long a finished run may take to release its output pipes before the sandbox is
	// killed. Default 200ms.
	KillGrace time.Duration
}

func (c *Config) setDefaults() {
	if c.RuntimePath == "" {
		c.RuntimePath = "runc"
	}
	if c.NodePath == "" {
		c.NodePath = "/usr/bin/node"
	}
	if c.PythonPath == "" {
		c.PythonPath = "/usr/bin/python3"
	}
	if c.UID == 0 {
		c.UID = 60000
	}
	if c.GID == 0 {
		c.GID = 60000
	}
	if c.Limits == (Limits{}) {
		c.Limits = DefaultLimits()
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "porthole"
	}
	if c.KillGrace == 0 {
		c.KillGrace = 200 * time.Millisecond
	}
}
