package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestKeys(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	k, full, err := s.CreateKey(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	owner, err := s.Authenticate(ctx, full)
	if err != nil || owner != "alice" {
		t.Fatalf("Authenticate = %q, %v", owner, err)
	}
	// The secret is not stored anywhere in the database.
	var n int
	secret := full[strings.LastIndex(full, "_")+1:]
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM api_keys WHERE CAST(secret_hash AS TEXT) LIKE ? OR id LIKE ?`, "%"+secret+"%", "%"+secret+"%").Scan(&n); err != nil || n != 0 {
		t.Fatalf("secret found in the store (%d, %v)", n, err)
	}
	for _, bad := range []string{"", "ph_", full + "x", "ph_" + k.ID + "_", strings.Replace(full, "_", "-", -1), "ph_nokey_" + secret} {
		if _, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("Authenticate(%q) = %v, want ErrNotFound", bad, err)
		}
	}
	if err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, full); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoked key still authenticates: %v", err)
	}
	if err := s.RevokeKey(ctx, "nosuchkey"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoking an unknown key: %v", err)
	}
	keys, err := s.ListKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}
	if _, _, err := s.CreateKey(ctx, "bad owner!"); err == nil {
		t.Fatal("bad owner name accepted")
	}
	s.Close()

	// Reopening applies no migration twice and keeps the data.
	s, err = Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RecordRun(ctx, Run{ID: "r1", Owner: "alice", Kind: "ephemeral", Language: "python", Outcome: "ok", DurationMs: 3, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	runs, err := s.Runs(ctx, "alice", 10)
	if err != nil || len(runs) != 1 || runs[0].Outcome != "ok" {
		t.Fatalf("Runs = %+v, %v", runs, err)
	}
	var mode string
	if err := s.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
}
