package runtime

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// PoolConfig sizes the warm pools.
type PoolConfig struct {
	// Size is how many ready sandboxes each language keeps. Default 4; 0 disables warming (every run
	// starts its sandbox cold).
	Size int
	// Starters is how many sandboxes may be starting at once across all languages. Default 2.
	Starters int
}

// Pool keeps pre-started sandboxes, per language, whose runners have loaded and wait for a run.
// Each one serves exactly one run, for one owner, and is never returned to the pool: a run takes it,
// and the pool starts a fresh one in the background.
type Pool struct {
	rt      *Runtime
	log     *zap.Logger
	size    int
	starter chan struct{} // semaphore over concurrent starts
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu       sync.Mutex
	ready    map[Language][]*Sandbox
	starting map[Language]int
	kick     map[Language]chan struct{}
}

// NewPool starts filling warm pools for every language. Close stops it.
func NewPool(rt *Runtime, cfg PoolConfig, log *zap.Logger) *Pool {
	if cfg.Starters <= 0 {
		cfg.Starters = 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		rt: rt, log: log, size: cfg.Size, starter: make(chan struct{}, cfg.Starters),
		ctx: ctx, cancel: cancel,
		ready: map[Language][]*Sandbox{}, starting: map[Language]int{}, kick: map[Language]chan struct{}{},
	}
	if p.size <= 0 {
		return p
	}
	for _, lang := range Languages {
		p.kick[lang] = make(chan struct{}, 1)
		// One filler per concurrent start, so a language refills as fast as the starters allow.
		for range cfg.Starters {
			p.wg.Add(1)
			go p.fill(lang)
		}
	}
	return p
}

// Ready returns how many warm sandboxes lang has now.
func (p *Pool) Ready(lang Language) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready[lang])
}

// Get returns a ready sandbox for lang: a warm one if there is one, else one started now.
// The pool's default limits apply; callers with other limits use Runtime.Start.
func (p *Pool) Get(ctx context.Context, lang Language) (*Sandbox, error) {
	p.mu.Lock()
	for len(p.ready[lang]) > 0 {
		q := p.ready[lang]
		s := q[0]
		p.ready[lang] = q[1:]
		if s.Exited() {
			continue // died while waiting (should not happen; never hand it out)
		}
		p.mu.Unlock()
		// Refill once this sandbox is gone, not now: on a small machine a sandbox starting in the
		// background would take CPU from the run about to happen in this one.
		go func() {
			select {
			case <-s.Done():
			case <-time.After(time.Second):
			}
			p.wake(lang)
		}()
		return s, nil
	}
	p.mu.Unlock()
	p.wake(lang)
	return p.rt.Start(ctx, lang, p.rt.cfg.Limits)
}

func (p *Pool) wake(lang Language) {
	if ch := p.kick[lang]; ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (p *Pool) fill(lang Language) {
	defer p.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		p.mu.Lock()
		need := len(p.ready[lang])+p.starting[lang] < p.size
		if need {
			p.starting[lang]++
		}
		p.mu.Unlock()
		if !need {
			select {
			case <-p.kick[lang]:
				continue
			case <-p.ctx.Done():
				return
			}
		}
		var s *Sandbox
		var err error
		select {
		case p.starter <- struct{}{}:
			s, err = p.rt.Start(p.ctx, lang, p.rt.cfg.Limits)
			<-p.starter
		case <-p.ctx.Done():
			err = p.ctx.Err()
		}
		p.mu.Lock()
		p.starting[lang]--
		if err == nil {
			if p.ctx.Err() != nil {
				p.mu.Unlock()
				s.Release()
				return
			}
			p.ready[lang] = append(p.ready[lang], s)
		}
		p.mu.Unlock()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.log.Warn("warm sandbox failed to start; retrying", zap.String("language", string(lang)), zap.Duration("backoff", backoff), zap.Error(err))
			select {
			case <-time.After(backoff):
			case <-p.ctx.Done():
				return
			}
			backoff = min(backoff*2, 10*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// Close stops refilling and releases every warm sandbox.
func (p *Pool) Close() {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for lang, q := range p.ready {
		for _, s := range q {
			s.Release()
		}
		delete(p.ready, lang)
	}
}
