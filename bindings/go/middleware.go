package shardlimit

import (
	"log"
	"net/http"
	"strings"
)

// MiddlewareOptions configures Middleware. Only Limiter and Policy are required.
type MiddlewareOptions struct {
	Limiter *Limiter
	// Policy is the name of a policy in the limiter's config.
	Policy string
	// Key returns the rate-limit key of a request. The default is the client's key from
	// ClientIPKey(RemoteAddr, X-Forwarded-For, TrustedProxies, IPv6Prefix): IPv6
	// clients are keyed by their network, not their address.
	Key func(*http.Request) string
	// IPv6Prefix is the network size the default Key gives IPv6 clients (0: 64).
	IPv6Prefix int
	// TrustedProxies are the CIDRs of reverse proxies whose X-Forwarded-For is believed
	// by the default Key. Empty: X-Forwarded-For is ignored.
	TrustedProxies []string
	// Cost returns the weight of a request (>= 1). The default is 1.
	Cost func(*http.Request) uint64
	// OnError handles a failed check (the policy's on_error mode has already been
	// applied by the core when it could). The default logs it and answers 503.
	OnError func(http.ResponseWriter, *http.Request, error)
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

// Middleware limits next with a policy: every response carries the rate-limit headers;
// a denied request gets 429 with the JSON body rendered by the core and never reaches
// next.
func Middleware(o MiddlewareOptions, next http.Handler) http.Handler {
	key := o.Key
	if key == nil {
		prefix := o.IPv6Prefix
		if prefix == 0 {
			prefix = DefaultIPv6Prefix
		}
		key = func(r *http.Request) string { return RequestKey(r, o.TrustedProxies, prefix) }
	}
	onError := o.OnError
	if onError == nil {
		onError = func(w http.ResponseWriter, r *http.Request, err error) {
			log.Printf("shardlimit: %s %s: %v", r.Method, r.URL.Path, err)
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cost := uint64(1)
		if o.Cost != nil {
			cost = o.Cost(r)
		}
		d, err := o.Limiter.Check(r.Context(), key(r), o.Policy, cost)
		if err != nil {
			onError(w, r, err)
			return
		}
		headers, err := d.Headers()
		if err != nil {
			onError(w, r, err)
			return
		}
		for _, h := range headers {
			w.Header().Set(h.Name, h.Value)
		}
		if !d.Allowed {
			body, err := d.Body()
			if err != nil {
				onError(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(body)
			return
		}
		next.ServeHTTP(w, r)
	})
}
