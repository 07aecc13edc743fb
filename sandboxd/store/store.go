// Package store is sandboxd's embedded database: SQLite through a pure-Go driver, in WAL mode, with
// schema migrations embedded in the binary. It keeps owners, hashed API keys and the run log.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"embed"
	"encoding/base32"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrNotFound is returned when a record does not exist.
var ErrNotFound = errors.New("not found")

// Store is the SQLite-backed store.
type Store struct {
	db *sql.DB
}

// Open opens (creating if needed) the database in dataDir and applies pending migrations.
func Open(ctx context.Context, dataDir string) (*Store, error) {
	path := filepath.Join(dataDir, "porthole.db")
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One writer at a time is SQLite's model; a small pool serves concurrent readers under WAL.
	db.SetMaxOpenConns(4)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("store: create migrations table: %w", err)
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return fmt.Errorf("store: list migrations: %w", err)
	}
	sort.Strings(names)
	for _, name := range names {
		version := strings.TrimSuffix(filepath.Base(name), ".sql")
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
			return fmt.Errorf("store: check migration %s: %w", version, err)
		}
		if n > 0 {
			continue
		}
		body, err := migrations.ReadFile(name)
		if err != nil {
			return fmt.Errorf("store: read migration %s: %w", version, err)
		}
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("store: migration %s: %w", version, err)
		}
		if _, err := tx.ExecContext(ctx, string(body)); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: apply migration %s: %w", version, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`, version, time.Now().Unix()); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: record migration %s: %w", version, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: commit migration %s: %w", version, err)
		}
	}
	return nil
}

// Key is an API key's record (never its secret).
type Key struct {
	ID        string
	Owner     string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// keyPrefix marks Porthole keys so secret scanners and people recognise them.
const keyPrefix = "ph_"

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return strings.ToLower(b32.EncodeToString(b))
}

func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// CreateKey creates owner if needed and a new key for it. It returns the full key, which is shown
// once and never stored: "ph_<id>_<secret>".
func (s *Store) CreateKey(ctx context.Context, owner string) (Key, string, error) {
	if err := ValidOwnerName(owner); err != nil {
		return Key{}, "", err
	}
	id := randomToken(8)      // 64 bits: public, names the key in listings and logs
	secret := randomToken(32) // 256 bits: the secret
	now := time.Now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Key{}, "", fmt.Errorf("store: create key: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO owners(name, created_at) VALUES (?, ?) ON CONFLICT(name) DO NOTHING`, owner, now.Unix()); err != nil {
		return Key{}, "", fmt.Errorf("store: create owner: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys(id, owner, secret_hash, created_at) VALUES (?, ?, ?, ?)`, id, owner, hashSecret(secret), now.Unix()); err != nil {
		return Key{}, "", fmt.Errorf("store: insert key: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return Key{}, "", fmt.Errorf("store: create key: %w", err)
	}
	return Key{ID: id, Owner: owner, CreatedAt: now}, keyPrefix + id + "_" + secret, nil
}

// ValidOwnerName accepts 1–64 characters of [A-Za-z0-9._@-].
func ValidOwnerName(owner string) error {
	if len(owner) == 0 || len(owner) > 64 {
		return fmt.Errorf("owner name must be 1 to 64 characters, got %d", len(owner))
	}
	for _, r := range owner {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._@-", r)) {
			return fmt.Errorf("owner name %q may only contain letters, digits and . _ @ -", owner)
		}
	}
	return nil
}

// Authenticate returns the owner of a full API key, or ErrNotFound for a malformed, unknown or
// revoked key. The secret is compared in constant time.
func (s *Store) Authenticate(ctx context.Context, fullKey string) (string, error) {
	rest, ok := strings.CutPrefix(fullKey, keyPrefix)
	if !ok {
		return "", ErrNotFound
	}
	id, secret, ok := strings.Cut(rest, "_")
	if !ok || len(id) == 0 || len(id) > 32 || len(secret) == 0 || len(secret) > 128 {
		return "", ErrNotFound
	}
	var owner string
	var hash []byte
	var revoked sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT owner, secret_hash, revoked_at FROM api_keys WHERE id = ?`, id).Scan(&owner, &hash, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("store: authenticate: %w", err)
	}
	if subtle.ConstantTimeCompare(hash, hashSecret(secret)) != 1 || revoked.Valid {
		return "", ErrNotFound
	}
	return owner, nil
}

// ListKeys lists every key, newest first.
func (s *Store) ListKeys(ctx context.Context) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, owner, created_at, revoked_at FROM api_keys ORDER BY created_at DESC, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list keys: %w", err)
	}
	defer rows.Close()
	var keys []Key
	for rows.Next() {
		var k Key
		var created int64
		var revoked sql.NullInt64
		if err := rows.Scan(&k.ID, &k.Owner, &created, &revoked); err != nil {
			return nil, fmt.Errorf("store: list keys: %w", err)
		}
		k.CreatedAt = time.Unix(created, 0)
		if revoked.Valid {
			t := time.Unix(revoked.Int64, 0)
			k.RevokedAt = &t
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// RevokeKey revokes a key by id (or by the full key). Revoking twice is not an error.
func (s *Store) RevokeKey(ctx context.Context, idOrKey string) error {
	id := idOrKey
	if rest, ok := strings.CutPrefix(idOrKey, keyPrefix); ok {
		id, _, _ = strings.Cut(rest, "_")
	}
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, time.Now().Unix(), id)
	if err != nil {
		return fmt.Errorf("store: revoke key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	return nil
}

// Run is one entry of the run log.
type Run struct {
	ID         string
	Owner      string
	Kind       string // "ephemeral" (sessions come later)
	Language   string
	Outcome    string
	DurationMs int64
	CreatedAt  time.Time
}

// RecordRun appends to the run log.
func (s *Store) RecordRun(ctx context.Context, r Run) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO runs(id, owner, kind, language, outcome, duration_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.Owner, r.Kind, r.Language, r.Outcome, r.DurationMs, r.CreatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: record run: %w", err)
	}
	return nil
}

// Runs lists an owner's runs, newest first, at most limit.
func (s *Store) Runs(ctx context.Context, owner string, limit int) ([]Run, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, owner, kind, language, outcome, duration_ms, created_at FROM runs WHERE owner = ? ORDER BY created_at DESC LIMIT ?`, owner, limit)
	if err != nil {
		return nil, fmt.Errorf("store: list runs: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		var r Run
		var created int64
		if err := rows.Scan(&r.ID, &r.Owner, &r.Kind, &r.Language, &r.Outcome, &r.DurationMs, &created); err != nil {
			return nil, fmt.Errorf("store: list runs: %w", err)
		}
		r.CreatedAt = time.UnixMilli(created)
		out = append(out, r)
	}
	return out, rows.Err()
}
