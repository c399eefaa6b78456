package shardlimit

/*
#include <stdlib.h>
#include "shardlimit.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"fmt"
	"unsafe"
)

// CheckShadow is Check in shadow mode for this one call, whatever the policy says: a
// check the limit would deny is allowed (Allowed and ShadowDenied are true, HasRetryAfter
// false), consumes nothing and is counted by key for ShadowReport. Block-list denials and
// on_error fallbacks are not shadowed. A concurrency policy is an InvalidArgument error.
func (l *Limiter) CheckShadow(ctx context.Context, key, policy string, cost uint64) (Decision, error) {
	var d Decision
	err := l.withPolicy(ctx, policy, func(h *handle, pol *C.shardlimit_policy) error {
		kp, kn := cStr(key)
		p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
			return C.shardlimit_check_shadow_start(h.p, kp, kn, pol, C.uint64_t(cost), cb, u, out, e)
		})
		if err != nil {
			return err
		}
		d, err = decisionOf(p, policy)
		return err
	})
	return d, err
}

// ShadowKey is one key's shadow-mode denials.
type ShadowKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
}

// ShadowReport is a policy's shadow-mode denials, summed over every shard.
type ShadowReport struct {
	Policy string `json:"policy"`
	// Total counts every shadow denial (listed keys, keys cut by top, and Untracked).
	Total uint64 `json:"total"`
	// Untracked counts the denials of keys beyond the bound of 1000 keys per policy per
	// shard.
	Untracked uint64 `json:"untracked"`
	// Keys are the keys with the most shadow denials, most first (ties by key).
	Keys []ShadowKey `json:"keys"`
}

// ShadowReport reads the shadow-mode denials of the named policy by key, summed over
// every shard (on the in-memory engine: this process's counts); top > 0 keeps that many
// keys. Like Check it waits without holding an OS thread and returns ctx.Err() as soon
// as ctx is done.
func (l *Limiter) ShadowReport(ctx context.Context, policy string, top int) (ShadowReport, error) {
	h, err := l.open(ctx)
	if err != nil {
		return ShadowReport{}, err
	}
	if top < 0 {
		top = 0
	}
	pp, pn := cStr(policy)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_shadow_report_start(h.p, pp, pn, C.size_t(top), cb, u, out, e)
	})
	if err != nil {
		return ShadowReport{}, err
	}
	text, _, err := stringOf(p)
	if err != nil {
		return ShadowReport{}, err
	}
	var r ShadowReport
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		return ShadowReport{}, &Error{Code: CodeInternal, Message: fmt.Sprintf("a shadow report the core wrote is not JSON: %v", err)}
	}
	return r, nil
}
