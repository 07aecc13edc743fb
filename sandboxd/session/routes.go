package session

import (
	"context"

	"github.com/porthole-dev/porthole/sandboxd/store"
)

// RouteEvent tells the edge that a sandbox's routing changed.
type RouteEvent struct {
	// Type is "upsert" (the sandbox exists; Status says whether it runs) or "delete".
	Type      string `json:"type"`
	SandboxID string `json:"sandboxId"`
	// Access is "private" or "public".
	Access string `json:"access,omitempty"`
	// Status is the session's status: running, stopped (a request wakes it) or lost.
	Status string `json:"status,omitempty"`
}

// Subscribe returns a channel of route changes and a snapshot of every session at the moment of
// subscribing; cancel stops it. A subscriber that does not keep up loses events and is closed, so it
// reconnects and gets a fresh snapshot (the edge treats a closed stream that way).
func (m *Manager) Subscribe(ctx context.Context) ([]RouteEvent, <-chan RouteEvent, func(), error) {
	ch := make(chan RouteEvent, 256)
	m.subMu.Lock()
	m.subs[ch] = struct{}{}
	m.subMu.Unlock()
	cancel := func() {
		m.subMu.Lock()
		if _, ok := m.subs[ch]; ok {
			delete(m.subs, ch)
			close(ch)
		}
		m.subMu.Unlock()
	}
	all, err := m.store.ListSessions(ctx, "")
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	snap := make([]RouteEvent, 0, len(all))
	for _, s := range all {
		snap = append(snap, eventOf(s))
	}
	return snap, ch, cancel, nil
}

func eventOf(s *store.Session) RouteEvent {
	return RouteEvent{Type: "upsert", SandboxID: s.ID, Access: s.PreviewAccess, Status: s.Status}
}

func (m *Manager) publish(ev RouteEvent) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	for ch := range m.subs {
		select {
		case ch <- ev:
		default:
			delete(m.subs, ch)
			close(ch)
		}
	}
}
