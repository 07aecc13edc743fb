package session

import (
	"context"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

// Reconcile is one pass of the maintenance job. It makes the runtime agree with the store:
//   - a runtime with no record (never registered, its session deleted, or its owner deleted) is
//     killed and removed, files included;
//   - a running record whose runtime vanished or stopped is marked lost;
//   - a record left "creating" by a previous process is removed with whatever runtime it has;
//   - a running session past its idle timeout or its lifetime is stopped (files kept).
//
// Sandboxes this process runs for ephemeral runs are never touched, nor is a session being created.
func (m *Manager) Reconcile(ctx context.Context) error {
	sessions, err := m.store.ListSessions(ctx, "")
	if err != nil {
		return err
	}
	byID := make(map[string]*store.Session, len(sessions))
	for _, s := range sessions {
		byID[s.ID] = s
	}
	// fresh re-reads a record: the snapshot above may predate a session that finished starting since.
	fresh := func(id string) *store.Session {
		s, err := m.store.GetSession(ctx, "", id)
		if err != nil {
			return nil
		}
		return s
	}
	keep := func(id string) bool {
		if _, creating := m.inflight.Load(id); creating {
			return true
		}
		if s, ok := byID[id]; ok && s.Status == store.StatusRunning {
			return true
		}
		s := fresh(id)
		return s != nil && (s.Status == store.StatusRunning || s.Status == store.StatusCreating && m.isInflight(id))
	}
	removed, err := m.rt.Sweep(ctx, keep)
	if err != nil {
		return err
	}
	containers, err := m.rt.Containers(ctx)
	if err != nil {
		return err
	}
	status := make(map[string]string, len(containers))
	for _, c := range containers {
		status[c.ID] = c.Status
	}
	for _, id := range removed {
		m.count("reaped_no_record")
		m.log.Info("reaped a runtime with no running session record", zap.String("sandbox", id))
		if s, ok := byID[id]; ok && s.Status == store.StatusCreating {
			_ = m.store.DeleteSession(ctx, id)
			m.publish(RouteEvent{Type: "delete", SandboxID: id})
		}
	}
	// Workspaces on disk whose session no longer exists.
	for _, id := range m.rt.SessionIDs() {
		if _, creating := m.inflight.Load(id); creating {
			continue
		}
		if _, ok := byID[id]; !ok && fresh(id) == nil && !m.isInflight(id) {
			if err := m.rt.RemoveSession(ctx, id); err == nil {
				m.count("removed_orphan_files")
				m.log.Info("removed the files of a session with no record", zap.String("sandbox", id))
			}
		}
	}
	now := time.Now()
	for _, s := range sessions {
		if m.isInflight(s.ID) {
			continue
		}
		if s.Status == store.StatusCreating || s.Status == store.StatusRunning {
			if s = fresh(s.ID); s == nil || m.isInflight(s.ID) {
				continue // deleted, or being created, since the snapshot
			}
		}
		switch s.Status {
		case store.StatusCreating:
			// Left by a previous process between registering and starting: its runtime (if any)
			// was swept above.
			_ = m.rt.RemoveSession(ctx, s.ID)
			_ = m.store.DeleteSession(ctx, s.ID)
			m.count("removed_unfinished")
			m.publish(RouteEvent{Type: "delete", SandboxID: s.ID})
		case store.StatusRunning:
			st := status[s.ID]
			if st != "running" {
				// The listing may predate a session that started since: ask about this one.
				st, _, err = m.rt.SessionState(ctx, s.ID)
				if err != nil {
					continue
				}
			}
			if st != "running" {
				_ = m.rt.StopSession(ctx, s.ID) // reap a dead init, remove a stopped container
				_ = m.store.SetSessionStatus(ctx, s.ID, store.StatusLost, "runtime "+orGone(st))
				m.count("marked_lost")
				m.log.Warn("session runtime vanished; marked lost", zap.String("session", s.ID), zap.String("runtime", orGone(st)))
				m.publish(RouteEvent{Type: "upsert", SandboxID: s.ID, Access: s.PreviewAccess, Status: store.StatusLost})
				continue
			}
			var reason string
			if idle := time.Duration(s.IdleTimeoutSec) * time.Second; idle > 0 && now.Sub(s.LastActiveAt) > idle {
				reason = "idle timeout"
			} else if life := time.Duration(s.MaxLifetimeSec) * time.Second; life > 0 && now.Sub(s.StartedAt) > life {
				reason = "lifetime"
			}
			if reason != "" {
				if err := m.stop(ctx, s, reason); err != nil {
					m.log.Warn("stop session", zap.String("session", s.ID), zap.Error(err))
					continue
				}
				m.count("stopped_" + map[string]string{"idle timeout": "idle", "lifetime": "lifetime"}[reason])
				m.log.Info("stopped session", zap.String("session", s.ID), zap.String("reason", reason))
			}
		}
	}
	return nil
}

func (m *Manager) isInflight(id string) bool {
	_, ok := m.inflight.Load(id)
	return ok
}

func orGone(st string) string {
	if st == "" {
		return "gone"
	}
	return st
}

// RunReaper runs Reconcile every interval until ctx ends.
func (m *Manager) RunReaper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.Reconcile(ctx); err != nil && ctx.Err() == nil {
				m.log.Error("maintenance pass", zap.Error(err))
			}
		}
	}
}
