// Command sandboxd is Porthole's sandbox daemon: it runs code in isolated sandboxes and serves the
// REST API. See docs/API.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/api"
	"github.com/porthole-dev/porthole/sandboxd/edgeapi"
	sbruntime "github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const usage = `sandboxd — Porthole's sandbox daemon

usage:
  sandboxd serve --listen ADDR --data-dir DIR --preview-domain DOMAIN [flags]
  sandboxd keys create --data-dir DIR --owner NAME     prints the new key as the last line
  sandboxd keys list   --data-dir DIR
  sandboxd keys revoke --data-dir DIR KEY_ID
  sandboxd owners list   --data-dir DIR
  sandboxd owners delete --data-dir DIR NAME           deletes its keys and sessions; the running
                                                      sandboxd reaps their sandboxes at its next pass

Every flag can also be set by an environment variable: --data-dir is PORTHOLE_DATA_DIR, and so on.
Run 'sandboxd serve -h' for all flags.
`

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("a command is required")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "keys":
		return keys(ctx, args[1:], stdout, stderr)
	case "owners":
		return owners(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// envDefault returns the value of PORTHOLE_<FLAG> (dashes as underscores), or def.
func envDefault(flagName, def string) string {
	if v, ok := os.LookupEnv("PORTHOLE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))); ok {
		return v
	}
	return def
}

func envInt(flagName string, def int) int {
	if v, err := strconv.Atoi(envDefault(flagName, "")); err == nil {
		return v
	}
	return def
}

// newFlagSet makes a flag set whose string and int flags default to their environment variables.
type flags struct{ *flag.FlagSet }

func newFlags(name string, stderr io.Writer) flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return flags{fs}
}

func (f flags) str(name, def, help string) *string {
	return f.String(name, envDefault(name, def), help+" (env PORTHOLE_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))+")")
}

func (f flags) num(name string, def int, help string) *int {
	return f.Int(name, envInt(name, def), help+" (env PORTHOLE_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))+")")
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	listen := fs.str("listen", "127.0.0.1:8080", "API listen address")
	dataDir := fs.str("data-dir", "/var/lib/porthole", "data directory: database, runtime state")
	previewDomain := fs.str("preview-domain", "preview.localhost", "domain under which previews are served")
	runtimePath := fs.str("runtime", "runc", "OCI runtime binary (runc, or runsc for gVisor)")
	logLevel := fs.str("log-level", "info", "log level: debug, info, warn, error")
	poolSize := fs.num("pool-size", 4, "warm sandboxes kept ready per language (0 disables warming)")
	starters := fs.num("pool-starters", runtime.NumCPU(), "sandboxes started at once to refill the pools")
	parallel := fs.num("max-parallel-runs", 8, "runs executing at once")
	queue := fs.num("max-queued-runs", 16, "runs waiting for a slot before new ones get 429")
	memMiB := fs.num("sandbox-memory-mib", 256, "memory limit of a sandbox, MiB")
	pids := fs.num("sandbox-pids", 128, "process and thread limit of a sandbox")
	tmpMiB := fs.num("sandbox-tmp-mib", 64, "size of a sandbox's /tmp, MiB")
	cpus := fs.Float64("sandbox-cpus", 1, "CPU bandwidth of a sandbox, in cores (env PORTHOLE_SANDBOX_CPUS)")
	maxSessions := fs.num("max-sessions-per-owner", 50, "running sessions one owner may have")
	previewPort := fs.num("preview-port", 443, "the edge's HTTPS port, shown in preview URLs unless 443")
	reapInterval := fs.Duration("reap-interval", envDuration("reap-interval", 30*time.Second), "how often the maintenance job reconciles sandboxes with the store (env PORTHOLE_REAP_INTERVAL)")
	internalListen := fs.str("internal-listen", "", "also serve the edge's internal endpoint on this TCP address (needs --internal-secret)")
	internalSecret := fs.str("internal-secret", "", "shared secret the edge sends on the TCP internal endpoint")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_ = previewDomain // used by previews (sessions); accepted now so the CLI contract holds

	level, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	zcfg := zap.NewProductionConfig()
	zcfg.Level = zap.NewAtomicLevelAt(level)
	zcfg.Sampling = nil
	log, err := zcfg.Build()
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer log.Sync()

	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	st, err := store.Open(ctx, *dataDir)
	if err != nil {
		return err
	}
	defer st.Close()

	limits := sbruntime.DefaultLimits()
	limits.MemoryBytes = int64(*memMiB) << 20
	limits.Pids = int64(*pids)
	limits.TmpBytes = int64(*tmpMiB) << 20
	if v, err := strconv.ParseFloat(os.Getenv("PORTHOLE_SANDBOX_CPUS"), 64); err == nil && !flagSet(fs.FlagSet, "sandbox-cpus") {
		*cpus = v
	}
	limits.CPUs = *cpus
	rt, err := sbruntime.New(ctx, sbruntime.Config{
		RuntimePath: *runtimePath,
		Dir:         filepath.Join(*dataDir, "runtime"),
		Limits:      limits,
	}, log.Named("runtime"))
	if err != nil {
		return err
	}
	defer rt.Close()
	sessions := session.New(session.Config{MaxSessionsPerOwner: *maxSessions}, log.Named("sessions"), st, rt)
	// Before serving: re-adopt running sessions, reap runtimes nobody owns, mark vanished ones lost.
	if err := sessions.Reconcile(ctx); err != nil {
		return fmt.Errorf("initial maintenance pass: %w", err)
	}
	pool := sbruntime.NewPool(rt, sbruntime.PoolConfig{Size: *poolSize, Starters: *starters}, log.Named("pool"))
	defer pool.Close()
	reapCtx, stopReaper := context.WithCancel(ctx)
	defer stopReaper()
	go sessions.RunReaper(reapCtx, *reapInterval)

	srv := api.New(api.Config{MaxParallelRuns: *parallel, MaxQueuedRuns: *queue, PreviewDomain: *previewDomain, PreviewPort: *previewPort},
		log.Named("api"), st, rt, pool, sessions)

	// The edge's internal endpoint: a unix socket in the data dir, never on the API listener.
	sock := filepath.Join(*dataDir, "internal.sock")
	_ = os.Remove(sock)
	internalLn, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("internal endpoint: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		return fmt.Errorf("internal endpoint: %w", err)
	}
	fwd, err := edgeapi.NewForwarder(filepath.Join(*dataDir, "fwd"), log.Named("forwarder"), sessions, rt)
	if err != nil {
		return err
	}
	go fwd.Run(reapCtx, 500*time.Millisecond)
	internal := &http.Server{Handler: edgeapi.New(log.Named("edgeapi"), sessions, rt, *previewDomain, ""), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = internal.Serve(internalLn) }()
	defer internal.Close()
	if *internalListen != "" {
		if len(*internalSecret) < 16 {
			return errors.New("--internal-listen needs --internal-secret of at least 16 characters")
		}
		tln, err := net.Listen("tcp", *internalListen)
		if err != nil {
			return fmt.Errorf("internal endpoint: %w", err)
		}
		tcpInternal := &http.Server{Handler: edgeapi.New(log.Named("edgeapi"), sessions, rt, *previewDomain, *internalSecret), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = tcpInternal.Serve(tln) }()
		defer tcpInternal.Close()
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("sandboxd serving", zap.String("listen", ln.Addr().String()), zap.String("dataDir", *dataDir),
		zap.String("previewDomain", *previewDomain), zap.Int("poolSize", *poolSize))

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case sig := <-sigs:
		log.Info("shutting down: draining runs in flight", zap.String("signal", sig.String()))
	}
	// Runs last at most 20s; give them that and a margin, then cut.
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("shutdown: runs still in flight were cut", zap.Error(err))
	}
	stopReaper()
	pool.Close()
	rt.Close()
	// Durable sessions keep running: they are re-adopted at the next start.
	log.Info("stopped; no ephemeral sandbox left", zap.Int64("sandboxesAlive", rt.Alive()))
	return nil
}

// flagSet reports whether a flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func envDuration(flagName string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(envDefault(flagName, "")); err == nil {
		return d
	}
	return def
}

// storeCommand prepares a subcommand of group that works on the store: it requires the subcommand,
// parses its flags (--data-dir, plus those define adds), and opens the store (creating the data dir
// when create is set). The caller closes the store.
func storeCommand(ctx context.Context, group, subcommands string, args []string, stderr io.Writer, create bool, define func(flags)) (flags, *store.Store, error) {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flags{}, nil, fmt.Errorf("%s: a subcommand is required: %s", group, subcommands)
	}
	fs := newFlags(group+" "+args[0], stderr)
	dataDir := fs.str("data-dir", "/var/lib/porthole", "data directory")
	if define != nil {
		define(fs)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return flags{}, nil, err
	}
	if create {
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			return flags{}, nil, fmt.Errorf("data dir: %w", err)
		}
	}
	st, err := store.Open(ctx, *dataDir)
	if err != nil {
		return flags{}, nil, err
	}
	return fs, st, nil
}

func owners(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, st, err := storeCommand(ctx, "owners", "list or delete", args, stderr, false, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	switch args[0] {
	case "list":
		names, err := st.Owners(ctx)
		if err != nil {
			return err
		}
		for _, n := range names {
			fmt.Fprintln(stdout, n)
		}
	case "delete":
		if fs.NArg() != 1 {
			return errors.New("owners delete: name one owner")
		}
		if err := st.DeleteOwner(ctx, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted owner %s with its keys and sessions; its sandboxes are reaped at the next maintenance pass\n", fs.Arg(0))
	default:
		return fmt.Errorf("owners: unknown subcommand %q: use list or delete", args[0])
	}
	return nil
}

func keys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var owner *string
	fs, st, err := storeCommand(ctx, "keys", "create, list or revoke", args, stderr, true, func(fs flags) {
		if args[0] == "create" {
			owner = fs.str("owner", "", "owner of the new key (created if new)")
		}
	})
	if err != nil {
		return err
	}
	defer st.Close()
	switch args[0] {
	case "create":
		if *owner == "" {
			return errors.New("keys create: --owner NAME is required")
		}
		k, full, err := st.CreateKey(ctx, *owner)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created key %s for owner %s; it is shown only once:\n%s\n", k.ID, k.Owner, full)
	case "list":
		keys, err := st.ListKeys(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tOWNER\tCREATED\tREVOKED")
		for _, k := range keys {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Owner, k.CreatedAt.UTC().Format(time.RFC3339), revoked)
		}
		return tw.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New("keys revoke: name one key id (see 'sandboxd keys list')")
		}
		if err := st.RevokeKey(ctx, fs.Arg(0)); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked %s\n", fs.Arg(0))
	default:
		return fmt.Errorf("keys: unknown subcommand %q: use create, list or revoke", args[0])
	}
	return nil
}
