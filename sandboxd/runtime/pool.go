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
	// starts its sandbox cold, in the request).
	Size int
	// Starters is how many sandboxes may be starting at once across all languages. Default 2.
	// Starting is CPU-bound (the OCI runtime and the interpreter): more starters than cores only
	// makes every start slower.
	Starters int
}

// Pool keeps pre-started sandboxes, per language, whose runners have loaded and wait for a run.
// Each one serves exactly one run, for one owner, and is never returned to the pool: a run takes it,
// and the pool starts a fresh one in the background. When a language's pool is empty, callers wait
// for the next sandbox the starters make, so the machine never runs more starts than Starters.
type Pool struct {
	rt      *Runtime
	log     *zap.Logger
	size    int
	starter chan struct{} // semaphore over concurrent starts
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu    sync.Mutex
	langs map[Language]*langPool
}

type langPool struct {
	ready    chan *Sandbox
	kick     chan struct{}
	starting int // guarded by Pool.mu
	waiting  int // callers blocked in Get; guarded by Pool.mu
}

// NewPool starts filling warm pools for every language. Close stops it.
func NewPool(rt *Runtime, cfg PoolConfig, log *zap.Logger) *Pool {
	if cfg.Starters <= 0 {
		cfg.Starters = 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		rt: rt, log: log, size: cfg.Size, starter: make(chan struct{}, cfg.Starters),
		ctx: ctx, cancel: cancel, langs: map[Language]*langPool{},
	}
	if p.size <= 0 {
		return p
	}
	for _, lang := range Languages {
		// The channel holds the ready sandboxes plus any handed straight to waiting callers.
		p.langs[lang] = &langPool{ready: make(chan *Sandbox, p.size+cfg.Starters), kick: make(chan struct{}, 1)}
		for range cfg.Starters {
			p.wg.Add(1)
			go p.fill(lang)
		}
	}
	return p
}

// Ready returns how many warm sandboxes lang has now.
func (p *Pool) Ready(lang Language) int {
	if lp := p.langs[lang]; lp != nil {
		return len(lp.ready)
	}
	return 0
}

// Get returns a ready sandbox for lang: a warm one if there is one, else the next one the pool
// starts. Without warming it starts one now. The pool's default limits apply; callers with other
// limits use Runtime.Start.
func (p *Pool) Get(ctx context.Context, lang Language) (*Sandbox, error) {
	lp := p.langs[lang]
	if lp == nil {
		return p.rt.Start(ctx, lang, p.rt.cfg.Limits)
	}
	for {
		select {
		case s := <-lp.ready:
			if s.Exited() {
				continue // died while waiting (should not happen); never hand it out
			}
			p.taken(lang, s)
			return s, nil
		default:
		}
		p.mu.Lock()
		lp.waiting++
		p.mu.Unlock()
		p.wake(lang)
		var s *Sandbox
		select {
		case s = <-lp.ready:
		case <-ctx.Done():
		case <-p.ctx.Done():
		}
		p.mu.Lock()
		lp.waiting--
		p.mu.Unlock()
		if s == nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, p.ctx.Err()
		}
		if s.Exited() {
			continue
		}
		p.taken(lang, s)
		return s, nil
	}
}

// taken schedules the refill for a sandbox just handed out: once it is gone, not now, because on a
// small machine a sandbox starting in the background takes CPU from the run about to happen.
// Waiting callers wake the starters themselves.
func (p *Pool) taken(lang Language, s *Sandbox) {
	go func() {
		select {
		case <-s.Done():
		case <-time.After(time.Second):
		case <-p.ctx.Done():
		}
		p.wake(lang)
	}()
}

func (p *Pool) wake(lang Language) {
	select {
	case p.langs[lang].kick <- struct{}{}:
	default:
	}
}

func (p *Pool) fill(lang Language) {
	defer p.wg.Done()
	lp := p.langs[lang]
	backoff := 100 * time.Millisecond
	for {
		p.mu.Lock()
		need := len(lp.ready)+lp.starting < p.size+lp.waiting
		if need {
			lp.starting++
		}
		p.mu.Unlock()
		if !need {
			select {
			case <-lp.kick:
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
		if err == nil {
			select {
			case lp.ready <- s:
			default:
				s.Release() // more than the pool holds (waiters gave up): not needed
			}
		}
		p.mu.Lock()
		lp.starting--
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
	for _, lp := range p.langs {
		for {
			select {
			case s := <-lp.ready:
				s.Release()
				continue
			default:
			}
			break
		}
	}
}
