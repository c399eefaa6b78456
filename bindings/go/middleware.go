//go:build cgo

package shardlimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MiddlewareOptions configures Middleware. Limiter and either Policy or Rules are
// required.
type MiddlewareOptions struct {
	Limiter *Limiter
	// Policy is the name of a policy in the limiter's config (one rule, keyed by Key).
	Policy string
	// Rules are layered limits (per IP, per API key, per tenant...): a request passes
	// only if every rule allows it, and a denial consumes nothing from any rule. When
	// set, Policy, Key and Cost are not used.
	Rules []Rule
	// Skip exempts a request (health checks, internal callers): it reaches next with no
	// check and no headers.
	Skip func(*http.Request) bool
	// Key returns the rate-limit key of a request for Policy; "" skips the request. The
	// default is the client's key from ClientIPKey(RemoteAddr, X-Forwarded-For,
	// TrustedProxies, IPv6Prefix): IPv6 clients are keyed by their network.
	Key func(*http.Request) string
	// IPv6Prefix is the network size the default Key gives IPv6 clients (0: 64).
	IPv6Prefix int
	// TrustedProxies are the CIDRs of reverse proxies whose X-Forwarded-For is believed
	// by the default Key. Empty: X-Forwarded-For is ignored. "unix" trusts a proxy that
	// connects over a Unix socket (whose RemoteAddr is "@" or a path, not an address):
	// the default Key then takes the client from its X-Forwarded-For. Without it, the
	// default Key refuses a request from a Unix socket (500 through OnError) rather than
	// key every client as one.
	TrustedProxies []string
	// Cost returns the weight of a request (>= 1). The default is 1.
	Cost func(*http.Request) uint64
	// OnLimited answers a request over its limit. The default: 429 with the JSON body
	// rendered by the core (the rate-limit headers are set already).
	OnLimited func(http.ResponseWriter, *http.Request, Decision)
	// OnUnavailable answers a request denied because the rate limiter itself failed (a
	// fallback decision: on_error "closed"): the client did nothing wrong, so the default
	// is 503 with Retry-After, never 429, and no rate-limit headers.
	OnUnavailable func(http.ResponseWriter, *http.Request, Decision)
	// OnError handles a failed check (on_error "error", or a caller mistake such as an
	// unknown policy). The default answers in JSON, as the other languages do: 503 with
	// Retry-After (UnavailableRetryAfter, else 1 s) and "error": "rate_limit_unavailable"
	// when Redis failed (a backend error, a timeout), else 500 with "error":
	// "rate_limit_error"; the "message" is the error's. It logs at most one line a
	// minute per middleware (with how many errors it did not log), not one per request.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Headers chooses the rate-limit headers of a checked response: HeadersBoth (the
	// default), HeadersLegacy (X-RateLimit-*), HeadersStandard (the IETF RateLimit and
	// RateLimit-Policy fields) or HeadersNone. Retry-After is always sent on a denial.
	Headers HeaderSet
	// RetryAfterDate sends Retry-After as an HTTP date instead of delta seconds.
	RetryAfterDate bool
	// UnavailableRetryAfter is the Retry-After of a 503 (a denying fallback); 0: the
	// decision's, at least one second.
	UnavailableRetryAfter time.Duration
	// DeductWhen, when set, counts only the requests whose response status it accepts
	// (func(s int) bool { return s >= 400 }: failed requests only, as Flask-Limiter's
	// deduct_when and express-rate-limit's skipSuccessfulRequests). Each request reserves
	// its units atomically (Reserve, or one CheckAll for several rules) and one that does
	// not count gets them back when next returns (Settle at 0: to the window that admitted
	// them; CheckAll's layers are refunded). A handler that panics counts.
	DeductWhen func(status int) bool
	// Shadow runs the middleware's policy in shadow mode, whatever the config says
	// (CheckShadow): a request its limit would deny passes, with nothing consumed and the
	// would-be denial reported (DecisionFrom's ShadowDenied, an EventShadowDenied, the
	// shadow report). For one rule (Policy, or one Rule), without DeductWhen; a layered
	// middleware puts "shadow": true on its policies in the config instead.
	Shadow bool
	// ConnectTimeout is the budget NewMiddleware gives Limiter.Connect (every shard's
	// connections and scripts) before it returns; 0: 5 s. Middleware and MiddlewareFunc
	// do not connect.
	ConnectTimeout time.Duration
}

// statusRecorder remembers the status a handler answered (200 when it only wrote a body).
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer's Flush, Hijack and deadlines.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// HeaderSet chooses which rate-limit headers the middleware sends.
type HeaderSet int

const (
	// HeadersBoth sends X-RateLimit-* and the IETF RateLimit fields.
	HeadersBoth HeaderSet = iota
	// HeadersLegacy sends X-RateLimit-Limit, -Remaining and -Reset (a Unix timestamp).
	HeadersLegacy
	// HeadersStandard sends the IETF RateLimit and RateLimit-Policy fields (delta seconds).
	HeadersStandard
	// HeadersNone sends no rate-limit header (Retry-After still goes with a denial).
	HeadersNone
)

// wanted tells whether the header set sends the header called name.
func (hs HeaderSet) wanted(name string) bool {
	switch {
	case strings.EqualFold(name, "Retry-After"):
		return true
	case strings.HasPrefix(strings.ToLower(name), "x-ratelimit-"):
		return hs == HeadersBoth || hs == HeadersLegacy
	case strings.EqualFold(name, "RateLimit"), strings.EqualFold(name, "RateLimit-Policy"):
		return hs == HeadersBoth || hs == HeadersStandard
	}
	return hs != HeadersNone
}

// retryAfter renders a wait as Retry-After: whole seconds, rounded up (at least the
// given floor), or the HTTP date that many seconds from now.
func retryAfter(wait time.Duration, asDate bool, now time.Time) string {
	secs := int64((wait + time.Second - 1) / time.Second)
	if asDate {
		return now.Add(time.Duration(secs) * time.Second).UTC().Format(http.TimeFormat)
	}
	return strconv.FormatInt(secs, 10)
}

// Rule is one layer of a layered middleware: Cost units of Policy for the request's Key.
// A Policy that is a concurrency limit holds a lease of Cost units for the request,
// given back when the handler returns (a panic or a client gone away included).
type Rule struct {
	Policy string
	// Key returns the request's key for this rule; "" skips the rule for this request
	// (an anonymous request has no API-key layer). Nil: the client's IP key, as the
	// middleware's default Key.
	Key func(*http.Request) string
	// Cost returns the weight of a request (>= 1); nil is 1.
	Cost func(*http.Request) uint64
}

type decisionKey struct{}

// DecisionFrom is the decision the middleware made for the request, for the handler
// (its Source, Remaining...); false when the middleware did not check it (skipped).
func DecisionFrom(ctx context.Context) (Decision, bool) {
	d, ok := ctx.Value(decisionKey{}).(Decision)
	return d, ok
}

// RequestIP is the client IP of r per ClientIP (trusting X-Forwarded-For only from
// the trusted proxies). A RemoteAddr that is not an address is returned as it is.
func RequestIP(r *http.Request, trusted []string) string {
	xff := strings.Join(r.Header.Values("X-Forwarded-For"), ",")
	ip, err := ClientIP(r.RemoteAddr, xff, trusted)
	if err != nil {
		return r.RemoteAddr
	}
	return ip
}

// RequestKey is the rate-limit key of r's client per ClientIPKey (trusting
// X-Forwarded-For only from the trusted proxies). A RemoteAddr that is not an address is
// returned as it is.
func RequestKey(r *http.Request, trusted []string, ipv6Prefix int) string {
	xff := strings.Join(r.Header.Values("X-Forwarded-For"), ",")
	k, err := ClientIPKey(r.RemoteAddr, xff, trusted, ipv6Prefix)
	if err != nil {
		return r.RemoteAddr
	}
	return k
}

// Middleware limits next: every checked response carries one set of rate-limit headers
// (X-RateLimit-Reset is a Unix timestamp; the IETF RateLimit field keeps delta seconds);
// a request over its limit gets 429 (OnLimited) and never reaches next; a request denied
// because the limiter failed gets 503 with Retry-After (OnUnavailable). Use one
// Middleware per handler for route-level limits.
func Middleware(o MiddlewareOptions, next http.Handler) http.Handler {
	return MiddlewareFunc(o)(next)
}

// MiddlewareFunc is Middleware as a function of the handler, for routers' middleware
// chains (r.With(shardlimit.MiddlewareFunc(o)).Get(...)). Options that cannot work (an
// unknown policy, say) panic here, when the middleware is built; NewMiddleware returns
// them as an error instead, and connects first.
func MiddlewareFunc(o MiddlewareOptions) func(http.Handler) http.Handler {
	mw, err := buildMiddleware(o)
	if err != nil {
		panic(err.Error())
	}
	return mw
}

// DefaultConnectTimeout is NewMiddleware's budget for connecting when
// MiddlewareOptions.ConnectTimeout is 0.
const DefaultConnectTimeout = 5 * time.Second

// NewMiddleware is MiddlewareFunc for a service's start-up, where it cannot fail open by
// accident: it checks the options (an error, not a panic) and then connects to every
// shard and loads the scripts (Limiter.Connect, within ConnectTimeout, or ctx), so the
// first requests never spend their per-call deadline on a TCP connect and fall back to
// on_error. A shard that does not answer is an error naming it: do not serve then (or
// serve knowing that on_error decides until it answers).
//
//	limit, err := shardlimit.NewMiddleware(ctx, shardlimit.MiddlewareOptions{Limiter: l, Policy: "api"})
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.ListenAndServe(":8080", limit(mux))
func NewMiddleware(ctx context.Context, o MiddlewareOptions) (func(http.Handler) http.Handler, error) {
	mw, err := buildMiddleware(o)
	if err != nil {
		return nil, err
	}
	timeout := o.ConnectTimeout
	switch {
	case timeout == 0:
		timeout = DefaultConnectTimeout
	case timeout < 0:
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument `ConnectTimeout`: must not be negative"}
	}
	if err := o.Limiter.Connect(ctx, timeout); err != nil {
		return nil, fmt.Errorf("shardlimit: NewMiddleware: connecting before serving: %w", err)
	}
	return mw, nil
}

// concurrencyPolicies is the set of the config's policies that are concurrency limits:
// the middleware takes a lease of those for the request instead of checking them.
func concurrencyPolicies(l *Limiter) (map[string]bool, error) {
	c, err := l.Config()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range c.Policies {
		for _, li := range p.Limits {
			if li.Algorithm == "concurrency" {
				out[p.Name] = true
			}
		}
	}
	return out, nil
}

// buildMiddleware is the middleware of o, or what is wrong with o.
func buildMiddleware(o MiddlewareOptions) (func(http.Handler) http.Handler, error) {
	prefix := o.IPv6Prefix
	if prefix == 0 {
		prefix = DefaultIPv6Prefix
	}
	trusted, trustUnix := make([]string, 0, len(o.TrustedProxies)), false
	for _, p := range o.TrustedProxies {
		if p == "unix" {
			trustUnix = true
		} else {
			trusted = append(trusted, p)
		}
	}
	ipKey := func(r *http.Request) (string, error) { return middlewareIPKey(r, trusted, trustUnix, prefix) }
	rules := o.Rules
	if len(rules) == 0 {
		rules = []Rule{{Policy: o.Policy, Key: o.Key, Cost: o.Cost}}
	}
	if o.Limiter == nil {
		return nil, errors.New("shardlimit: MiddlewareOptions.Limiter is nil")
	}
	// which rules take a lease is decided per request, from the config in force: a
	// reload may make a policy a concurrency limit (or stop it being one)
	policies := &concurrencyCache{l: o.Limiter}
	concurrency, err := policies.get()
	if err != nil {
		return nil, fmt.Errorf("shardlimit: MiddlewareOptions: reading the limiter's config: %w", err)
	}
	// the rules keyed by the client's IP (a Key of their own is nil): their key can fail
	rules = append([]Rule(nil), rules...)
	for i := range rules {
		// a policy the config lacks is a mistake made here: say so now, not with an
		// error on every request
		p, err := o.Limiter.Policy(rules[i].Policy)
		if err != nil {
			return nil, fmt.Errorf("shardlimit: MiddlewareOptions: the policy of rule %d: %w", i, err)
		}
		_ = p.Close()
		if concurrency[rules[i].Policy] && o.Shadow {
			return nil, fmt.Errorf("shardlimit: MiddlewareOptions.Shadow: the policy %q of rule %d is a concurrency limit, which cannot run in shadow", rules[i].Policy, i)
		}
	}
	if o.Headers < HeadersBoth || o.Headers > HeadersNone {
		return nil, fmt.Errorf("shardlimit: MiddlewareOptions.Headers %d is not a HeaderSet", o.Headers)
	}
	if o.UnavailableRetryAfter < 0 {
		return nil, errors.New("shardlimit: MiddlewareOptions.UnavailableRetryAfter is negative")
	}
	if o.Shadow && (len(rules) > 1 || o.DeductWhen != nil) {
		return nil, errors.New("shardlimit: MiddlewareOptions.Shadow takes one rule and no DeductWhen (put \"shadow\": true on the policies of a layered middleware)")
	}
	onError := o.OnError
	if onError == nil {
		logged := &errorLog{}
		onError = func(w http.ResponseWriter, r *http.Request, err error) {
			logged.log(r, err, time.Now())
			status, retry, code := http.StatusInternalServerError, time.Duration(0), "rate_limit_error"
			var se *Error
			if errors.As(err, &se) && se.IsBackend() {
				// Redis failed (on_error "error"): not the client's fault, and it may pass soon
				status, retry, code = http.StatusServiceUnavailable, time.Second, "rate_limit_unavailable"
				if o.UnavailableRetryAfter > 0 {
					retry = o.UnavailableRetryAfter
				}
			}
			body, _ := json.Marshal(map[string]string{"error": code, "message": err.Error()})
			if retry > 0 {
				w.Header().Set("Retry-After", retryAfter(retry, o.RetryAfterDate, time.Now()))
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(body)
		}
	}
	onLimited := o.OnLimited
	if onLimited == nil {
		onLimited = func(w http.ResponseWriter, r *http.Request, d Decision) {
			body, err := d.Body()
			if err != nil {
				onError(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(body)
		}
	}
	onUnavailable := o.OnUnavailable
	if onUnavailable == nil {
		onUnavailable = func(w http.ResponseWriter, r *http.Request, d Decision) {
			body, err := unavailableBody(d)
			if err != nil {
				onError(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write(body)
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.Skip != nil && o.Skip(r) {
				next.ServeHTTP(w, r)
				return
			}
			concurrency, err := policies.get()
			if err != nil {
				onError(w, r, err)
				return
			}
			layers := make([]Layer, 0, len(rules))
			var leaseLayers []Layer // the rules on concurrency policies
			for _, rule := range rules {
				var key string
				if rule.Key != nil {
					key = rule.Key(r)
				} else if key, err = ipKey(r); err != nil {
					onError(w, r, err)
					return
				}
				if key == "" {
					continue // this rule does not apply to this request
				}
				cost := uint64(1)
				if rule.Cost != nil {
					cost = rule.Cost(r)
				}
				if concurrency[rule.Policy] {
					leaseLayers = append(leaseLayers, Layer{Key: key, Policy: rule.Policy, Cost: cost})
					continue
				}
				layers = append(layers, Layer{Key: key, Policy: rule.Policy, Cost: cost})
			}
			if len(layers) == 0 && len(leaseLayers) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			var d Decision
			var reservation *Reservation
			if len(leaseLayers) > 0 {
				// the leases first: a denial of one then consumes nothing from the rate
				// layers; they are given back when the handler returns, panics included
				// (a client gone away ends the handler through its context)
				var leases []*Lease
				defer func() { releaseAll(r, leases) }()
				d, leases, err = acquireAll(r.Context(), o.Limiter, leaseLayers)
				if err != nil {
					onError(w, r, err)
					return
				}
			}
			switch {
			case len(layers) == 0 || !d.Allowed && len(leaseLayers) > 0:
				// only leases, or a lease was denied: d is the leases' decision
			case len(layers) == 1 && o.DeductWhen != nil:
				d, reservation, err = o.Limiter.Reserve(r.Context(), layers[0].Key, layers[0].Policy, layers[0].Cost)
			case o.Shadow:
				d, err = o.Limiter.CheckShadow(r.Context(), layers[0].Key, layers[0].Policy, layers[0].Cost)
			case len(layers) == 1:
				d, err = o.Limiter.Check(r.Context(), layers[0].Key, layers[0].Policy, layers[0].Cost)
			default:
				d, err = o.Limiter.CheckAll(r.Context(), layers)
			}
			if err != nil {
				onError(w, r, err)
				return
			}
			if !d.Allowed && d.Source == SourceFallback {
				// the limiter failed and its policy denies: not the client's fault
				retry := d.RetryAfter
				if o.UnavailableRetryAfter > 0 {
					retry = o.UnavailableRetryAfter
				} else if !d.HasRetryAfter || retry < time.Second {
					retry = time.Second
				}
				w.Header().Set("Retry-After", retryAfter(retry, o.RetryAfterDate, time.Now()))
				onUnavailable(w, r, d)
				return
			}
			headers, err := d.Headers()
			if err != nil {
				onError(w, r, err)
				return
			}
			now := time.Now()
			for _, h := range headers {
				if !o.Headers.wanted(h.Name) {
					continue
				}
				// the core's values (X-RateLimit-Reset the Unix time of the reset, as
				// from d.Headers() and every binding); only Retry-After's form is ours
				if h.Name == "Retry-After" && o.RetryAfterDate && d.HasRetryAfter {
					h.Value = retryAfter(d.RetryAfter, true, now)
				}
				w.Header().Set(h.Name, h.Value)
			}
			if !d.Allowed {
				onLimited(w, r, d)
				return
			}
			if d.Delay > 0 {
				// a shaper (leaky bucket) admitted the request for later: hold it until
				// then; a client that goes away meanwhile is not served (its queued
				// unit leaks away)
				t := time.NewTimer(d.Delay)
				select {
				case <-t.C:
				case <-r.Context().Done():
					t.Stop()
					return
				}
			}
			r = r.WithContext(context.WithValue(r.Context(), decisionKey{}, d))
			if o.DeductWhen == nil || (reservation == nil && len(layers) == 1) {
				next.ServeHTTP(w, r)
				return
			}
			rec := &statusRecorder{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			if rec.status == 0 {
				rec.status = http.StatusOK
			}
			if o.DeductWhen(rec.status) {
				return
			}
			// the response is written; the give-back must not end with the client's request
			ctx := context.WithoutCancel(r.Context())
			if reservation != nil {
				_, err = reservation.Settle(ctx, 0)
			} else {
				for _, l := range layers {
					if _, e := o.Limiter.Refund(ctx, l.Key, l.Policy, l.Cost); e != nil {
						err = e
					}
				}
			}
			if err != nil {
				log.Printf("shardlimit: %s %s: giving the request's units back: %v", r.Method, r.URL.Path, err)
			}
		})
	}, nil
}

// middlewareIPKey is the default Key: the client's IP key per ClientIPKey. A peer that is
// not an IP address is a Unix socket's ("@", or a path): with trustUnix its
// X-Forwarded-For names the client (its last hop is the peer the proxy saw), else it is
// an error, never one key shared by every client.
func middlewareIPKey(r *http.Request, trusted []string, trustUnix bool, prefix int) (string, error) {
	xff := strings.Join(r.Header.Values("X-Forwarded-For"), ",")
	peer := r.RemoteAddr
	if _, err := netip.ParseAddrPort(peer); err != nil {
		if _, err := netip.ParseAddr(peer); err != nil {
			if !trustUnix {
				return "", &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("the client's address %q is not an IP address (a Unix socket?): every client would share one budget; behind a proxy on a Unix socket add \"unix\" to MiddlewareOptions.TrustedProxies (the client then comes from X-Forwarded-For), or set a Key", peer)}
			}
			hops := strings.Split(xff, ",")
			last := strings.TrimSpace(hops[len(hops)-1])
			if last == "" {
				return "", &Error{Code: CodeInvalidArgument, Message: "a request from the trusted proxy on the Unix socket has no X-Forwarded-For: it does not name the client"}
			}
			peer, xff = last, strings.Join(hops[:len(hops)-1], ",")
		}
	}
	return ClientIPKey(peer, xff, trusted, prefix)
}

// errorLog logs a middleware's failed checks: at most one line a minute, with the number
// of errors since the last line (on_error "error" during an outage fails every request).
type errorLog struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

func (e *errorLog) log(r *http.Request, err error, now time.Time) {
	e.mu.Lock()
	if now.Before(e.next) {
		e.suppressed++
		e.mu.Unlock()
		return
	}
	n := e.suppressed
	e.suppressed, e.next = 0, now.Add(time.Minute)
	e.mu.Unlock()
	if n > 0 {
		log.Printf("shardlimit: %s %s: %v (and %d more failed checks in the last minute)", r.Method, r.URL.Path, err, n)
	} else {
		log.Printf("shardlimit: %s %s: %v", r.Method, r.URL.Path, err)
	}
}

// unavailableBody is the JSON body of a 503 (a denying fallback): the core's body with
// "error": "rate_limit_unavailable", as every middleware answers (tower, Python, Node).
func unavailableBody(d Decision) ([]byte, error) {
	raw, err := d.Body()
	if err != nil {
		return nil, err
	}
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, err
	}
	body["error"] = "rate_limit_unavailable"
	return json.Marshal(body)
}

// acquireAll takes a lease of each layer, in order. When one is denied, the leases taken
// are given back and its decision returned (with no leases); otherwise the decision of
// the last layer and every lease taken (a lease may be nil: a fallback allowed it).
func acquireAll(ctx context.Context, l *Limiter, layers []Layer) (Decision, []*Lease, error) {
	leases := make([]*Lease, 0, len(layers))
	var d Decision
	for _, layer := range layers {
		var lease *Lease
		var err error
		d, lease, err = l.Acquire(ctx, layer.Key, layer.Policy, layer.Cost)
		if err != nil || !d.Allowed {
			_ = giveBack(ctx, leases)
			return d, nil, err
		}
		if lease != nil {
			leases = append(leases, lease)
		}
	}
	return d, leases, nil
}

// releaseAll gives the request's leases back, also when the client has gone away (the
// release must not end with the request's context).
func releaseAll(r *http.Request, leases []*Lease) {
	if err := giveBack(r.Context(), leases); err != nil {
		log.Printf("shardlimit: %s %s: releasing the request's lease: %v", r.Method, r.URL.Path, err)
	}
}

func giveBack(ctx context.Context, leases []*Lease) error {
	ctx = context.WithoutCancel(ctx)
	var first error
	for _, le := range leases {
		if _, err := le.Release(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
