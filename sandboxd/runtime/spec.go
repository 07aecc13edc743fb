package runtime

import (
	"fmt"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Paths inside every sandbox.
const (
	RunnerDir    = "/opt/porthole"
	WorkspaceDir = "/workspace"
	AgentDir     = "/run/porthole" // a session's agent socket
)

// hostRootLinks are the top-level host entries a sandbox sees besides /usr: on a merged-/usr host they
// are symlinks into /usr and are recreated as such in the rootfs skeleton; otherwise they are bound.
var hostRootLinks = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// maskedPaths and readonlyPaths are Docker's defaults: kernel interfaces a sandbox has no business with.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	"/sys/devices/virtual/powercap",
}
var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// bundleSpec describes one sandbox for specBuilder.
type bundleSpec struct {
	ID     string
	Args   []string
	Env    []string
	Limits Limits
	// Binds are extra read-only bind mounts (host source → destination), e.g. a non-merged /lib.
	Binds map[string]string
	// WorkspaceHost, when set, is a host directory bound read-write at /workspace instead of a
	// tmpfs of the sandbox's own (sessions keep their files across stop and resume this way).
	WorkspaceHost string
	// RunHost, when set, is a host directory bound read-write at /run/porthole: the agent's socket.
	RunHost string
}

// buildSpec returns the OCI runtime spec of one sandbox. rootfs is the shared read-only skeleton.
func (r *Runtime) buildSpec(b bundleSpec) *specs.Spec {
	l := b.Limits
	period := uint64(100000)
	quota := int64(l.CPUs * float64(period))
	mem := l.MemoryBytes
	pids := l.Pids
	oomScore := 500
	noFile := l.OpenFiles

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=16m"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		{Destination: "/etc", Type: "bind", Source: filepath.Join(r.assetsDir(), "etc"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Destination: RunnerDir, Type: "bind", Source: filepath.Join(r.assetsDir(), "runner"), Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", l.TmpBytes)}},
	}
	if b.WorkspaceHost != "" {
		mounts = append(mounts, specs.Mount{Destination: WorkspaceDir, Type: "bind", Source: b.WorkspaceHost, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	} else {
		mounts = append(mounts, specs.Mount{Destination: WorkspaceDir, Type: "tmpfs", Source: "tmpfs", Options: []string{
			"nosuid", "nodev", "mode=0755", fmt.Sprintf("size=%d", l.WorkspaceBytes),
			fmt.Sprintf("uid=%d", r.cfg.UID), fmt.Sprintf("gid=%d", r.cfg.GID)}})
	}
	if b.RunHost != "" {
		mounts = append(mounts, specs.Mount{Destination: AgentDir, Type: "bind", Source: b.RunHost, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
	}
	for src, dst := range b.Binds {
		mounts = append(mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}

	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: r.cfg.UID, GID: r.cfg.GID, AdditionalGids: []uint32{r.cfg.GID}},
			Args:     b.Args,
			Env:      b.Env,
			Cwd:      WorkspaceDir,
			// No capabilities in any set: the sandbox user is unprivileged and stays so.
			Capabilities:    &specs.LinuxCapabilities{},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: noFile, Soft: noFile}, {Type: "RLIMIT_CORE", Hard: 0, Soft: 0}},
			NoNewPrivileges: true,
			OOMScoreAdj:     &oomScore,
		},
		Root:     &specs.Root{Path: filepath.Join(r.assetsDir(), "rootfs"), Readonly: true},
		Hostname: "sandbox",
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: filepath.Join(r.cfg.CgroupParent, b.ID),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &mem},
				Pids:    &specs.LinuxPids{Limit: &pids},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			Seccomp:       seccompProfile(),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
}
