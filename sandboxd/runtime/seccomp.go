package runtime

import (
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// deniedSyscalls fail with EPERM inside a sandbox. The list covers what Docker's default profile denies
// to a container without capabilities (mount, namespaces, tracing, keyrings, BPF, kexec, modules, clock
// and swap control, ...) plus io_uring, whose history of kernel bugs made Docker drop it too.
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "chroot", "clock_adjtime", "clock_adjtime64", "clock_settime", "clock_settime64",
	"create_module", "delete_module", "finit_module", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
	"get_kernel_syms", "get_mempolicy", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup",
	"ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mbind",
	"mount", "mount_setattr", "move_mount", "move_pages", "name_to_handle_at", "nfsservctl", "open_by_handle_at",
	"open_tree", "perf_event_open", "pidfd_getfd", "pivot_root", "process_vm_readv", "process_vm_writev",
	"ptrace", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "set_mempolicy", "setns",
	"settimeofday", "stime", "swapoff", "swapon", "syslog", "_sysctl", "sysfs", "umount", "umount2",
	"unshare", "uselib", "userfaultfd", "ustat", "vhangup", "vm86", "vm86old",
}

// namespaceFlags are the clone(2) flags that create namespaces; clone with any of them is denied.
var namespaceFlags = []uint64{
	syscall.CLONE_NEWNS, syscall.CLONE_NEWUTS, syscall.CLONE_NEWIPC, syscall.CLONE_NEWUSER,
	syscall.CLONE_NEWPID, syscall.CLONE_NEWNET, syscall.CLONE_NEWCGROUP,
}

// seccompProfile is a deny-list profile: everything not named is allowed. clone3 answers ENOSYS so
// libc falls back to clone(2), whose flags a filter can inspect (clone3 passes them in memory).
func seccompProfile() *specs.LinuxSeccomp {
	eperm := uint(syscall.EPERM)
	enosys := uint(syscall.ENOSYS)
	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32, specs.ArchAARCH64, specs.ArchARM},
		Syscalls: []specs.LinuxSyscall{
			{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
	for _, f := range namespaceFlags {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names:    []string{"clone"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			// x86_64 and arm64 both pass clone's flags as argument 0.
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: f, ValueTwo: f, Op: specs.OpMaskedEqual}},
		})
	}
	return s
}
