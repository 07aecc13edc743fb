package api

import (
	"context"
	"errors"
)

// errQueueFull means the run was not admitted: every slot is busy and the queue is full.
var errQueueFull = errors.New("run queue full")

// limiter bounds parallel runs, with a short queue in front. A run beyond both is refused at once
// (429), so overload shows as fast refusals rather than as ever-growing latency.
type limiter struct {
	admitted chan struct{} // running + queued
	slots    chan struct{} // running
}

func newLimiter(parallel, queue int) *limiter {
	return &limiter{admitted: make(chan struct{}, parallel+queue), slots: make(chan struct{}, parallel)}
}

// acquire admits a run and waits for a slot. The returned func releases it.
func (l *limiter) acquire(ctx context.Context) (func(), error) {
	select {
	case l.admitted <- struct{}{}:
	default:
		return nil, errQueueFull
	}
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots; <-l.admitted }, nil
	case <-ctx.Done():
		<-l.admitted
		return nil, ctx.Err()
	}
}

// queued is how many admitted runs wait for a slot.
func (l *limiter) queued() int { return max(len(l.admitted)-len(l.slots), 0) }

// running is how many runs hold a slot.
func (l *limiter) running() int { return len(l.slots) }
