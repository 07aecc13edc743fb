// Package session manages durable sessions: one long-lived sandbox each, registered to its owner
// in the store before its runtime starts; threads linked to sessions; and the maintenance job that
// reconciles the runtime with the store.
package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

// Errors the API maps to its error model.
var (
	ErrNotFound = errors.New("session not found")        // also for another owner's session
	ErrLost     = errors.New("session runtime was lost") // 409: create a new session
	ErrLimit    = errors.New("session limit reached")    // 429
)

// Config bounds sessions. Zero fields take the defaults documented on each.
type Config struct {
	// DefaultIdleTimeout stops a session with no activity for this long. Default 15 minutes.
	DefaultIdleTimeout time.Duration
	// MaxIdleTimeout is the largest idleTimeoutSec accepted. Default 24 hours.
	MaxIdleTimeout time.Duration
	// DefaultLifetime stops a session this long after it was created. Default 24 hours.
	DefaultLifetime time.Duration
	// MaxLifetime is the largest maxLifetimeSec accepted. Default 7 days.
	MaxLifetime time.Duration
	// MaxSessionsPerOwner bounds the running sessions of one owner. Default 50.
	MaxSessionsPerOwner int
}

func (c *Config) setDefaults() {
	if c.DefaultIdleTimeout == 0 {
		c.DefaultIdleTimeout = 15 * time.Minute
	}
	if c.MaxIdleTimeout == 0 {
		c.MaxIdleTimeout = 24 * time.Hour
	}
	if c.DefaultLifetime == 0 {
		c.DefaultLifetime = 24 * time.Hour
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = 7 * 24 * time.Hour
	}
	if c.MaxSessionsPerOwner == 0 {
		c.MaxSessionsPerOwner = 50
	}
}

// Manager owns the sessions' lifecycle. Dependencies are passed in.
type Manager struct {
	cfg   Config
	log   *zap.Logger
	store *store.Store
	rt    *runtime.Runtime

	locks    sync.Map // session id or "thread:<owner>:<thread>" → *sync.Mutex
	inflight sync.Map // session ids being created by this process

	subMu sync.Mutex
	subs  map[chan RouteEvent]struct{}

	// Counters for /metrics, by action.
	countMu sync.Mutex
	counts  map[string]int
}

// New builds a manager.
func New(cfg Config, log *zap.Logger, st *store.Store, rt *runtime.Runtime) *Manager {
	cfg.setDefaults()
	return &Manager{cfg: cfg, log: log, store: st, rt: rt, subs: map[chan RouteEvent]struct{}{}, counts: map[string]int{}}
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) lock(key string) func() {
	v, _ := m.locks.LoadOrStore(key, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

func (m *Manager) count(action string) {
	m.countMu.Lock()
	m.counts[action]++
	m.countMu.Unlock()
}

// Counts returns how often each maintenance and lifecycle action happened.
func (m *Manager) Counts() map[string]int {
	m.countMu.Lock()
	defer m.countMu.Unlock()
	out := make(map[string]int, len(m.counts))
	for k, v := range m.counts {
		out[k] = v
	}
	return out
}

// CreateOptions are a session's settings.
type CreateOptions struct {
	Language      runtime.Language
	PreviewAccess string // "private" (default) or "public"
	Timeout       time.Duration
	IdleTimeout   time.Duration
	Lifetime      time.Duration
	ThreadID      string
	Metadata      json.RawMessage
}

// Create registers a session to owner, then starts its sandbox.
func (m *Manager) Create(ctx context.Context, owner string, o CreateOptions) (*store.Session, error) {
	if o.IdleTimeout == 0 {
		o.IdleTimeout = m.cfg.DefaultIdleTimeout
	}
	if o.Lifetime == 0 {
		o.Lifetime = m.cfg.DefaultLifetime
	}
	if o.PreviewAccess == "" {
		o.PreviewAccess = "private"
	}
	if len(o.Metadata) == 0 {
		o.Metadata = json.RawMessage("{}")
	}
	running := 0
	all, err := m.store.ListSessions(ctx, owner)
	if err != nil {
		return nil, err
	}
	for _, s := range all {
		if s.Status == store.StatusRunning || s.Status == store.StatusCreating {
			running++
		}
	}
	if running >= m.cfg.MaxSessionsPerOwner {
		return nil, fmt.Errorf("%w: %d running sessions (stop or delete one)", ErrLimit, running)
	}
	now := time.Now()
	ses := &store.Session{
		ID: runtime.NewID(), Owner: owner, Language: string(o.Language), PreviewAccess: o.PreviewAccess,
		Status: store.StatusCreating, ThreadID: o.ThreadID, Metadata: string(o.Metadata), State: "{}",
		TimeoutMs: int(o.Timeout.Milliseconds()), IdleTimeoutSec: int(o.IdleTimeout.Seconds()),
		MaxLifetimeSec: int(o.Lifetime.Seconds()), CreatedAt: now, LastActiveAt: now,
	}
	// Registered first: a runtime never exists without a record naming its owner.
	m.inflight.Store(ses.ID, true)
	defer m.inflight.Delete(ses.ID)
	if err := m.store.CreateSession(ctx, ses); err != nil {
		return nil, err
	}
	if err := m.rt.StartSession(context.WithoutCancel(ctx), ses.ID, o.Language, m.rt.Limits()); err != nil {
		m.log.Error("start session", zap.String("session", ses.ID), zap.Error(err))
		_ = m.rt.RemoveSession(context.Background(), ses.ID)
		_ = m.store.DeleteSession(context.Background(), ses.ID)
		return nil, fmt.Errorf("start session sandbox: %w", err)
	}
	if err := m.store.SetSessionStatus(ctx, ses.ID, store.StatusRunning, ""); err != nil {
		return nil, err
	}
	ses.Status = store.StatusRunning
	m.count("created")
	m.publish(RouteEvent{Type: "upsert", SandboxID: ses.ID, Access: ses.PreviewAccess, Status: ses.Status})
	return ses, nil
}

// Get returns owner's session id, or ErrNotFound (also when another owner has it).
func (m *Manager) Get(ctx context.Context, owner, id string) (*store.Session, error) {
	ses, err := m.store.GetSession(ctx, owner, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	return ses, err
}

// List returns owner's sessions.
func (m *Manager) List(ctx context.Context, owner string) ([]*store.Session, error) {
	return m.store.ListSessions(ctx, owner)
}

// Delete ends owner's session: its runtime, namespaces and files go, then its record.
func (m *Manager) Delete(ctx context.Context, owner, id string) error {
	if _, err := m.Get(ctx, owner, id); err != nil {
		return err
	}
	defer m.lock(id)()
	if err := m.rt.RemoveSession(context.WithoutCancel(ctx), id); err != nil {
		return err
	}
	if err := m.store.DeleteSession(context.WithoutCancel(ctx), id); err != nil {
		return err
	}
	m.count("deleted")
	m.publish(RouteEvent{Type: "delete", SandboxID: id})
	return nil
}

// Ready returns owner's session, running: a stopped one is resumed (its files are kept), a lost one
// is ErrLost. Every use of a session goes through here and counts as activity.
func (m *Manager) Ready(ctx context.Context, owner, id string) (*store.Session, error) {
	ses, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	unlock := m.lock(id)
	defer unlock()
	return m.readyLocked(ctx, ses)
}

func (m *Manager) readyLocked(ctx context.Context, ses *store.Session) (*store.Session, error) {
	switch ses.Status {
	case store.StatusRunning:
	case store.StatusStopped:
		// In flight, like a create, so the maintenance job does not take the starting runtime
		// (whose record still says stopped) for one nobody owns.
		m.inflight.Store(ses.ID, true)
		defer m.inflight.Delete(ses.ID)
		if err := m.rt.StartSession(context.WithoutCancel(ctx), ses.ID, runtime.Language(ses.Language), m.rt.Limits()); err != nil {
			return nil, fmt.Errorf("resume session: %w", err)
		}
		if err := m.store.SetSessionStatus(ctx, ses.ID, store.StatusRunning, ""); err != nil {
			return nil, err
		}
		ses.Status = store.StatusRunning
		m.count("resumed")
		m.publish(RouteEvent{Type: "upsert", SandboxID: ses.ID, Access: ses.PreviewAccess, Status: ses.Status})
	case store.StatusLost:
		return nil, ErrLost
	default:
		return nil, fmt.Errorf("%w: session is %s", ErrLost, ses.Status)
	}
	_ = m.store.TouchSession(ctx, ses.ID, time.Now(), "")
	return ses, nil
}

// Execute runs code in owner's session. The state it returns is stored for the next execute; a run
// that fails keeps the previous state.
func (m *Manager) Execute(ctx context.Context, owner, id string, lang runtime.Language, req runtime.RunRequest) (*runtime.RunResult, *store.Session, error) {
	ses, err := m.Get(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	unlock := m.lock(id) // executes of one session run one at a time, in order
	defer unlock()
	ses, err = m.readyLocked(ctx, ses)
	if err != nil {
		return nil, nil, err
	}
	if req.State == nil {
		req.State = json.RawMessage(ses.State)
	}
	res, err := m.rt.ExecuteInSession(ctx, id, lang, req, m.rt.Limits())
	if err != nil {
		return nil, nil, err
	}
	state := ""
	if res.OK && len(res.State) > 0 {
		state = string(res.State)
	}
	if err := m.store.TouchSession(context.WithoutCancel(ctx), id, time.Now(), state); err != nil {
		m.log.Error("store session state", zap.String("session", id), zap.Error(err))
	}
	if state == "" {
		res.State = json.RawMessage(ses.State)
	}
	return res, ses, nil
}

// Stop stops a session's sandbox, keeping its files; the next use resumes it.
func (m *Manager) stop(ctx context.Context, ses *store.Session, reason string) error {
	defer m.lock(ses.ID)()
	if err := m.rt.StopSession(ctx, ses.ID); err != nil {
		return err
	}
	if err := m.store.SetSessionStatus(ctx, ses.ID, store.StatusStopped, reason); err != nil {
		return err
	}
	m.publish(RouteEvent{Type: "upsert", SandboxID: ses.ID, Access: ses.PreviewAccess, Status: store.StatusStopped})
	return nil
}

// Thread returns owner's session linked to threadID.
func (m *Manager) Thread(ctx context.Context, owner, threadID string) (*store.Session, error) {
	ses, err := m.store.SessionByThread(ctx, owner, threadID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	return ses, err
}

// StartThread is idempotent: it returns the thread's running session, resumes a stopped one,
// replaces a lost one, or creates one. Concurrent calls for one thread yield one session.
func (m *Manager) StartThread(ctx context.Context, owner, threadID string, o CreateOptions) (*store.Session, bool, error) {
	defer m.lock("thread:" + owner + ":" + threadID)()
	ses, err := m.store.SessionByThread(ctx, owner, threadID)
	switch {
	case err == nil && ses.Status != store.StatusLost:
		ses, err = m.Ready(ctx, owner, ses.ID)
		return ses, false, err
	case err == nil: // lost: its runtime is gone; the thread gets a fresh session
		if err := m.Delete(ctx, owner, ses.ID); err != nil {
			return nil, false, err
		}
	case !errors.Is(err, store.ErrNotFound):
		return nil, false, err
	}
	o.ThreadID = threadID
	ses, err = m.Create(ctx, owner, o)
	return ses, err == nil, err
}

// Resolve returns the running session with this sandbox id, for the edge (any owner).
func (m *Manager) Resolve(ctx context.Context, id string) (*store.Session, error) {
	ses, err := m.store.GetSession(ctx, "", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	return ses, err
}

// Touch records activity on a session (a preview connection), without waking it.
func (m *Manager) Touch(id string) {
	_ = m.store.TouchSession(context.Background(), id, time.Now(), "")
}
