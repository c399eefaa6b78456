package shardlimit

/*
#include <stdint.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"sync"
	"sync/atomic"
)

// ConfigGeneration is how many reloads the limiter has applied (0 when it was made; one
// more for each Reload, ReloadFromFile or watched-file reload, once the new config is in
// force). Cheap: what is derived from Config (which policies are concurrency limits, as
// the middleware derives) is derived again when it changes. Read it before Config.
func (l *Limiter) ConfigGeneration() (uint64, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return 0, err
	}
	var g C.uint64_t
	var e *C.shardlimit_error
	if rc := C.shardlimit_config_generation(h.p, &g, &e); rc != C.SHARDLIMIT_OK {
		return 0, takeError(rc, e)
	}
	return uint64(g), nil
}

// concurrencyCache is the set of a limiter's concurrency policies as of a config
// generation: a middleware asks it per request (one cheap call when nothing changed) and
// it reads the config again after a reload, so a policy that a reload makes a
// concurrency limit is acquired from the next request on (and one that stops being one
// is checked).
type concurrencyCache struct {
	l     *Limiter
	mu    sync.Mutex // held while the config is read again
	state atomic.Pointer[concurrencyState]
}

type concurrencyState struct {
	generation uint64
	set        map[string]bool
}

// get is the set in force now.
func (c *concurrencyCache) get() (map[string]bool, error) {
	g, err := c.l.ConfigGeneration()
	if err != nil {
		return nil, err
	}
	if s := c.state.Load(); s != nil && s.generation == g {
		return s.set, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.state.Load(); s != nil && s.generation == g {
		return s.set, nil
	}
	// the generation was read first: a reload after it shows as a change next time
	set, err := concurrencyPolicies(c.l)
	if err != nil {
		return nil, err
	}
	c.state.Store(&concurrencyState{generation: g, set: set})
	return set, nil
}
