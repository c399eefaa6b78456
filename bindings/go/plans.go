package shardlimit

/*
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"runtime"
	"time"
	"unsafe"
)

// Quota is one limit of a multi-limit policy as the headers describe it.
type Quota struct {
	Limit  uint64        // the effective limit (units per window, or bucket capacity)
	Window time.Duration // the window it is measured over
}

func limitIndex(d *C.shardlimit_decision) int {
	if !d.has_limit_index {
		return -1
	}
	return int(d.limit_index)
}

// quotasOf allocates only for a multi-limit policy.
func quotasOf(d *C.shardlimit_decision) []Quota {
	n := int(d.quota_count)
	if n == 0 {
		return nil
	}
	out := make([]Quota, 0, n)
	for i := 0; i < n && i < len(d.quotas); i++ {
		q := d.quotas[i]
		out = append(out, Quota{Limit: uint64(q.limit), Window: time.Duration(q.window_us) * time.Microsecond})
	}
	return out
}

// NewPolicyFromRate is an ad-hoc policy of a rate string in the limits package's syntax
// ("5/minute", "10/second; 1000/day": several limits are checked together, atomically,
// in one call), each limit of algorithm (not Concurrency). name "" names it after
// its limits. A bad string is ErrInvalidArgument quoting the bad part.
func NewPolicyFromRate(name, rate string, algorithm Algorithm) (*Policy, error) {
	var p *C.shardlimit_policy
	var e *C.shardlimit_error
	np, nn := cStr(name)
	rp, rn := cStr(rate)
	if rc := C.shardlimit_policy_new_rate(np, nn, rp, rn, C.uint32_t(algorithm), &p, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	return wrapPolicy(p), nil
}

// PlanPolicy is the named policy of the limiter's config as plan has it: the plan's
// limits under the policy's name (the same keys and headers), or the policy itself when
// the plan does not list it. Check under a plan with CheckPolicy. ErrInvalidArgument for
// an unknown plan, ErrUnknownPolicy for an unknown policy.
func (l *Limiter) PlanPolicy(plan, policy string) (*Policy, error) {
	h, err := l.open(context.Background())
	if err != nil {
		return nil, err
	}
	var p *C.shardlimit_policy
	var e *C.shardlimit_error
	pp, pn := cStr(plan)
	np, nn := cStr(policy)
	if rc := C.shardlimit_plan_policy(h.p, pp, pn, np, nn, &p, &e); rc != C.SHARDLIMIT_OK {
		return nil, takeError(rc, e)
	}
	return wrapPolicy(p), nil
}

// PeekPolicy is Peek with a Policy object: an ad-hoc policy, or one from Policy or
// PlanPolicy.
func (l *Limiter) PeekPolicy(ctx context.Context, key string, policy *Policy) (Decision, error) {
	h, err := l.open(ctx)
	if err != nil {
		return Decision{}, err
	}
	ph, err := policy.handle()
	if err != nil {
		return Decision{}, err
	}
	defer runtime.KeepAlive(policy)
	kp, kn := cStr(key)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_peek_start(h.p, kp, kn, ph, cb, u, out, e)
	})
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(p, policy.name)
}
