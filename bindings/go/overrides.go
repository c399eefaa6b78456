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
	"time"
	"unsafe"
)

// Override is a key's live override of a policy: the limit its checks are decided by
// instead of the policy's, in every process of every language sharing the shards.
type Override struct {
	Key    string
	Policy string
	// Limit is the limit object in JSON as a config policy writes it, e.g.
	// {"algorithm":"fixed_window","limit":100,"window":"60000ms"}: SetOverride takes it back.
	Limit json.RawMessage
	// Remaining is the time left; Permanent is true for an override until deleted.
	Remaining time.Duration
	Permanent bool
}

// OverridePage is one page of ListOverrides; Cursor continues it ("" on the last page).
type OverridePage struct {
	Overrides []Override
	Cursor    string
}

type overrideJSON struct {
	Key         string          `json:"key"`
	Policy      string          `json:"policy"`
	Limit       json.RawMessage `json:"limit"`
	RemainingMs *uint64         `json:"remaining_ms"`
}

func (o overrideJSON) override() Override {
	out := Override{Key: o.Key, Policy: o.Policy, Limit: o.Limit, Permanent: o.RemainingMs == nil}
	if o.RemainingMs != nil {
		out.Remaining = time.Duration(*o.RemainingMs) * time.Millisecond
	}
	return out
}

func takeString(s *C.shardlimit_string) string {
	defer C.shardlimit_string_free(s)
	return C.GoStringN(s.ptr, C.int(s.len))
}

func decodeOverride(text string) (*Override, error) {
	var o overrideJSON
	if err := json.Unmarshal([]byte(text), &o); err != nil {
		return nil, &Error{Code: CodeInternal, Message: fmt.Sprintf("an override the core wrote is not JSON: %v", err)}
	}
	out := o.override()
	return &out, nil
}

// The override calls start on the core's I/O runtime like Check (the C ABI's _start
// calls): the goroutine parks until the answer comes or ctx is done (ctx.Err() then), and
// no OS thread is held while Redis answers.

// SetOverride sets key's override of policy (a config policy with "overrides": true) to
// limit: a rate string ("100/minute", in the policy's algorithm) or a limit object in
// JSON as in a config policy; for ttl (0: until deleted). The key's next check, in every
// process, is decided by it.
func (l *Limiter) SetOverride(ctx context.Context, key, policy, limit string, ttl time.Duration) (*Override, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	if ttl < 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `ttl`: must not be negative"}
	}
	ms := uint64((ttl + time.Millisecond - 1) / time.Millisecond)
	kp, kn := cStr(key)
	pp, pn := cStr(policy)
	lp, ln := cStr(limit)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_set_override_start(h.p, kp, kn, pp, pn, lp, ln, C.uint64_t(ms), cb, u, out, e)
	})
	if err != nil {
		return nil, err
	}
	text, _, err := stringOf(p)
	if err != nil {
		return nil, err
	}
	return decodeOverride(text)
}

// GetOverride is key's override of policy, or nil when it has none.
func (l *Limiter) GetOverride(ctx context.Context, key, policy string) (*Override, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	kp, kn := cStr(key)
	pp, pn := cStr(policy)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_get_override_start(h.p, kp, kn, pp, pn, cb, u, out, e)
	})
	if err != nil {
		return nil, err
	}
	text, found, err := stringOf(p)
	if err != nil || !found {
		return nil, err
	}
	return decodeOverride(text)
}

// DeleteOverride deletes key's override of policy and reports whether it had one; its
// next check, in every process, is decided by the policy's own limit.
func (l *Limiter) DeleteOverride(ctx context.Context, key, policy string) (bool, error) {
	h, err := l.open(ctx)
	if err != nil {
		return false, err
	}
	kp, kn := cStr(key)
	pp, pn := cStr(policy)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_delete_override_start(h.p, kp, kn, pp, pn, cb, u, out, e)
	})
	if err != nil {
		return false, err
	}
	return boolOf(p)
}

// ListOverrides is one page of policy's overrides on every shard, about limit of them
// (1 to 10000); pass the page's Cursor for the next ("" for the first).
func (l *Limiter) ListOverrides(ctx context.Context, policy, cursor string, limit int) (*OverridePage, error) {
	h, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("invalid argument `limit`: must be between 1 and 10000, got %d", limit)}
	}
	pp, pn := cStr(policy)
	cp, cn := cStr(cursor)
	p, err := l.await(ctx, func(cb C.shardlimit_callback, u unsafe.Pointer, out **C.shardlimit_pending, e **C.shardlimit_error) C.shardlimit_result {
		return C.shardlimit_list_overrides_start(h.p, pp, pn, cp, cn, C.size_t(limit), cb, u, out, e)
	})
	if err != nil {
		return nil, err
	}
	text, _, err := stringOf(p)
	if err != nil {
		return nil, err
	}
	var page struct {
		Overrides []overrideJSON `json:"overrides"`
		Cursor    *string        `json:"cursor"`
	}
	if err := json.Unmarshal([]byte(text), &page); err != nil {
		return nil, &Error{Code: CodeInternal, Message: fmt.Sprintf("a page the core wrote is not JSON: %v", err)}
	}
	res := &OverridePage{Overrides: make([]Override, 0, len(page.Overrides))}
	for _, o := range page.Overrides {
		res.Overrides = append(res.Overrides, o.override())
	}
	if page.Cursor != nil {
		res.Cursor = *page.Cursor
	}
	return res, nil
}
