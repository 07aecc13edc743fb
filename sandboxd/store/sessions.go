package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Session statuses.
const (
	StatusCreating = "creating" // registered; its runtime is starting
	StatusRunning  = "running"
	StatusStopped  = "stopped" // stopped on purpose (idle, lifetime); files kept, resumable
	StatusLost     = "lost"    // its runtime vanished
)

// Session is a durable session's record.
type Session struct {
	ID             string
	Owner          string
	Language       string
	PreviewAccess  string
	Status         string
	StatusReason   string
	ThreadID       string
	Metadata       string // JSON object
	State          string // JSON object
	TimeoutMs      int
	IdleTimeoutSec int
	MaxLifetimeSec int
	CreatedAt      time.Time
	StartedAt      time.Time
	LastActiveAt   time.Time
}

// ErrConflict is returned when a unique key (a thread id) is taken.
var ErrConflict = errors.New("conflict")

const sessionCols = `id, owner, language, preview_access, status, status_reason, COALESCE(thread_id, ''), metadata, state,
	timeout_ms, idle_timeout_sec, max_lifetime_sec, created_at, started_at, last_active_at`

func scanSession(row interface{ Scan(...any) error }) (*Session, error) {
	var s Session
	var created, started, active int64
	if err := row.Scan(&s.ID, &s.Owner, &s.Language, &s.PreviewAccess, &s.Status, &s.StatusReason, &s.ThreadID,
		&s.Metadata, &s.State, &s.TimeoutMs, &s.IdleTimeoutSec, &s.MaxLifetimeSec, &created, &started, &active); err != nil {
		return nil, err
	}
	s.CreatedAt, s.StartedAt, s.LastActiveAt = time.UnixMilli(created), time.UnixMilli(started), time.UnixMilli(active)
	return &s, nil
}

// CreateSession registers a session (status creating) before its runtime starts. A thread id already
// linked for this owner is ErrConflict.
func (s *Store) CreateSession(ctx context.Context, ses *Session) error {
	var thread any
	if ses.ThreadID != "" {
		thread = ses.ThreadID
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO sessions(id, owner, language, preview_access, status, thread_id, metadata, state,
		timeout_ms, idle_timeout_sec, max_lifetime_sec, created_at, started_at, last_active_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		ses.ID, ses.Owner, ses.Language, ses.PreviewAccess, ses.Status, thread, ses.Metadata, ses.State,
		ses.TimeoutMs, ses.IdleTimeoutSec, ses.MaxLifetimeSec, ses.CreatedAt.UnixMilli(), ses.CreatedAt.UnixMilli(), ses.LastActiveAt.UnixMilli())
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE") {
			return fmt.Errorf("store: thread %q already has a session: %w", ses.ThreadID, ErrConflict)
		}
		if strings.Contains(err.Error(), "FOREIGN KEY") {
			return fmt.Errorf("store: owner %q: %w", ses.Owner, ErrNotFound)
		}
		return fmt.Errorf("store: create session: %w", err)
	}
	return nil
}

// GetSession returns session id if owner owns it (owner "" matches any owner: internal use).
func (s *Store) GetSession(ctx context.Context, owner, id string) (*Session, error) {
	q := `SELECT ` + sessionCols + ` FROM sessions WHERE id = ?`
	args := []any{id}
	if owner != "" {
		q += ` AND owner = ?`
		args = append(args, owner)
	}
	ses, err := scanSession(s.db.QueryRowContext(ctx, q, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get session: %w", err)
	}
	return ses, nil
}

// SessionByThread returns owner's session linked to threadID.
func (s *Store) SessionByThread(ctx context.Context, owner, threadID string) (*Session, error) {
	ses, err := scanSession(s.db.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions WHERE owner = ? AND thread_id = ?`, owner, threadID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: session by thread: %w", err)
	}
	return ses, nil
}

// ListSessions lists owner's sessions (owner "": all), oldest first.
func (s *Store) ListSessions(ctx context.Context, owner string) ([]*Session, error) {
	q := `SELECT ` + sessionCols + ` FROM sessions`
	var args []any
	if owner != "" {
		q += ` WHERE owner = ?`
		args = append(args, owner)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sessions: %w", err)
	}
	defer rows.Close()
	var out []*Session
	for rows.Next() {
		ses, err := scanSession(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list sessions: %w", err)
		}
		out = append(out, ses)
	}
	return out, rows.Err()
}

// SetSessionStatus records a status change; becoming running restarts the lifetime and idle clocks.
func (s *Store) SetSessionStatus(ctx context.Context, id, status, reason string) error {
	var err error
	if status == StatusRunning {
		now := time.Now().UnixMilli()
		_, err = s.db.ExecContext(ctx, `UPDATE sessions SET status = ?, status_reason = ?, started_at = ?, last_active_at = ? WHERE id = ?`, status, reason, now, now, id)
	} else {
		_, err = s.db.ExecContext(ctx, `UPDATE sessions SET status = ?, status_reason = ? WHERE id = ?`, status, reason, id)
	}
	if err != nil {
		return fmt.Errorf("store: set session status: %w", err)
	}
	return nil
}

// TouchSession records activity, and the state after a run when state is not empty.
func (s *Store) TouchSession(ctx context.Context, id string, at time.Time, state string) error {
	var err error
	if state != "" {
		_, err = s.db.ExecContext(ctx, `UPDATE sessions SET last_active_at = ?, state = ? WHERE id = ?`, at.UnixMilli(), state, id)
	} else {
		_, err = s.db.ExecContext(ctx, `UPDATE sessions SET last_active_at = ? WHERE id = ?`, at.UnixMilli(), id)
	}
	if err != nil {
		return fmt.Errorf("store: touch session: %w", err)
	}
	return nil
}

// DeleteSession removes a session's record.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sessions WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete session: %w", err)
	}
	return nil
}

// DeleteOwner deletes an owner with its keys and session records. Its runtimes are reaped by the
// maintenance job, which finds them without a record.
func (s *Store) DeleteOwner(ctx context.Context, owner string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM owners WHERE name = ?`, owner)
	if err != nil {
		return fmt.Errorf("store: delete owner: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("owner %q: %w", owner, ErrNotFound)
	}
	return nil
}

// Owners lists owner names.
func (s *Store) Owners(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM owners ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list owners: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}
