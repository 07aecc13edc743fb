package runtime

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Remains lists what of sandbox id still exists on the host: runtime state, bundle, cgroups and
// processes. An empty list means the sandbox is wholly gone. Tests and the reaper use it.
func (r *Runtime) Remains(ctx context.Context, id string) []string {
	var found []string
	if ids, err := r.List(ctx); err == nil {
		for _, c := range ids {
			if c == id {
				found = append(found, "runtime state "+c)
			}
		}
	} else {
		found = append(found, "runtime list failed: "+err.Error())
	}
	if _, err := os.Stat(r.bundleDir(id)); err == nil {
		found = append(found, "bundle "+r.bundleDir(id))
	}
	return append(found, HostTraces(id)...)
}

// HostTraces lists what of sandbox id exists host-wide: cgroups, processes, mounts naming it.
func HostTraces(id string) []string {
	var found []string
	// Cgroups live under /sys/fs/cgroup/<controller>/.../<parent>/<id> (v1) or /sys/fs/cgroup/.../<id> (v2).
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.Count(strings.TrimPrefix(p, "/sys/fs/cgroup"), "/") > 6 {
			return fs.SkipDir
		}
		if d.Name() == id {
			found = append(found, "cgroup "+p)
			return fs.SkipDir
		}
		return nil
	})
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), id) {
		found = append(found, "host mount naming "+id)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), "/"+id) {
			stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
			found = append(found, "process "+strings.TrimSpace(string(stat)))
		}
	}
	return found
}
