package io.shardlimit.servlet;

import io.shardlimit.Decision;
import io.shardlimit.Json;
import io.shardlimit.Lease;
import io.shardlimit.Limiter;
import io.shardlimit.Results.Acquired;
import io.shardlimit.ShardlimitException;
import jakarta.servlet.AsyncEvent;
import jakarta.servlet.AsyncListener;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Function;

/**
 * A Jakarta Servlet filter (Servlet 6: Tomcat 10.1+/11, Jetty 12, Spring Boot 3 and 4) that
 * limits requests by path, as the Python, Node, Go and Rust middlewares do:
 * <ul>
 *   <li>rules by path: {@code "/api/*"} (a prefix) or {@code "/login"} (exact), the first that
 *       matches decides; a request no rule matches passes untouched;</li>
 *   <li>the key: the client's address ({@code ip:<address>}, IPv6 by its /64), taken from
 *       {@code X-Forwarded-For} only when the peer is one of the trusted proxies; or a request
 *       header (e.g. an API key); or a function of the request (null: not limited);</li>
 *   <li>every checked response carries the core's headers ({@code X-RateLimit-*},
 *       {@code RateLimit}, {@code RateLimit-Policy}); a denial is {@code 429} with
 *       {@code Retry-After} and the core's JSON body; a fallback that denies (the limit could
 *       not be checked: {@code on_error: closed}, an open circuit) is {@code 503} with
 *       {@code Retry-After: 1} and the same body with {@code "error": "rate_limit_unavailable"};
 *       {@code on_error: error} lets the core's exception reach the container;</li>
 *   <li>a concurrency policy holds a lease for the request, released when its response ends
 *       (also for async requests, and when the chain throws);</li>
 *   <li>the decision is the request attribute {@code shardlimit.decision}.</li>
 * </ul>
 */
public final class RateLimitFilter implements Filter {
    /** The request attribute holding the decision. */
    public static final String DECISION_ATTRIBUTE = "shardlimit.decision";

    private final Limiter limiter;
    private final List<Rule> rules;
    private final Function<HttpServletRequest, String> key;
    private final int outageRetryAfter;

    /** One rule: the requests under {@code pattern} cost {@code cost} units of {@code policy}. */
    public record Rule(String pattern, String policy, long cost) {
        public Rule {
            Objects.requireNonNull(pattern, "pattern");
            Objects.requireNonNull(policy, "policy");
        }

        boolean matches(String path) {
            if (pattern.endsWith("/*")) {
                String prefix = pattern.substring(0, pattern.length() - 1);
                return path.startsWith(prefix) || path.equals(prefix.substring(0, prefix.length() - 1));
            }
            if (pattern.equals("*") || pattern.equals("/*")) {
                return true;
            }
            return path.equals(pattern);
        }
    }

    private RateLimitFilter(Builder b) {
        this.limiter = b.limiter;
        this.rules = List.copyOf(b.rules);
        this.key = b.key != null ? b.key : clientAddress(b.trustedProxies);
        this.outageRetryAfter = b.outageRetryAfter;
    }

    /** A filter over {@code limiter}: add rules, and how to key requests. */
    public static Builder builder(Limiter limiter) {
        return new Builder(limiter);
    }

    /** Builds a {@link RateLimitFilter}. */
    public static final class Builder {
        private final Limiter limiter;
        private final List<Rule> rules = new ArrayList<>();
        private List<String> trustedProxies = List.of();
        private Function<HttpServletRequest, String> key;
        private int outageRetryAfter = 1;

        private Builder(Limiter limiter) {
            this.limiter = Objects.requireNonNull(limiter, "limiter");
        }

        /** Requests under {@code pattern} ({@code "/api/*"} or an exact path) take one unit of {@code policy}. */
        public Builder rule(String pattern, String policy) {
            return rule(pattern, policy, 1);
        }

        public Builder rule(String pattern, String policy, long cost) {
            rules.add(new Rule(pattern, policy, cost));
            return this;
        }

        /** The proxies (CIDRs) whose X-Forwarded-For is believed (none by default). */
        public Builder trustedProxies(List<String> cidrs) {
            this.trustedProxies = List.copyOf(cidrs);
            return this;
        }

        /** Keys requests by a header (e.g. {@code X-Api-Key}); a request without it is keyed by its address. */
        public Builder keyHeader(String header, List<String> trustedProxies) {
            Function<HttpServletRequest, String> byAddress = clientAddress(List.copyOf(trustedProxies));
            this.key = req -> {
                String v = req.getHeader(header);
                return v == null || v.isEmpty() ? byAddress.apply(req) : header.toLowerCase() + ":" + v;
            };
            return this;
        }

        /** Keys requests by a function (null: the request is not limited). */
        public Builder key(Function<HttpServletRequest, String> key) {
            this.key = Objects.requireNonNull(key, "key");
            return this;
        }

        /** The {@code Retry-After} seconds of a 503 (default 1). */
        public Builder outageRetryAfter(int seconds) {
            if (seconds < 0) {
                throw new IllegalArgumentException("outageRetryAfter must be >= 0");
            }
            this.outageRetryAfter = seconds;
            return this;
        }

        public RateLimitFilter build() {
            return new RateLimitFilter(this);
        }
    }

    /** The key {@code ip:<client address>}, X-Forwarded-For believed from {@code trustedProxies} only. */
    public static Function<HttpServletRequest, String> clientAddress(List<String> trustedProxies) {
        // the CIDRs are checked once, here (a bad one is an invalid_argument error)
        Limiter.clientIpKey("127.0.0.1", null, trustedProxies, 64);
        return req -> "ip:" + Limiter.clientIpKey(req.getRemoteAddr(), req.getHeader("X-Forwarded-For"),
                trustedProxies, 64);
    }

    private static String path(HttpServletRequest req) {
        String uri = req.getRequestURI();
        String ctx = req.getContextPath();
        return ctx != null && !ctx.isEmpty() && uri.startsWith(ctx) ? uri.substring(ctx.length()) : uri;
    }

    /** The policies known to be concurrency limits (a check of one is an invalid_argument error). */
    private final Set<String> leased = ConcurrentHashMap.newKeySet();

    private boolean isConcurrency(String policy) {
        return "concurrency".equals(limiter.policy(policy).get("algorithm"));
    }

    @Override
    public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        if (!(request instanceof HttpServletRequest req) || !(response instanceof HttpServletResponse res)) {
            chain.doFilter(request, response);
            return;
        }
        String path = path(req);
        Rule rule = null;
        for (Rule r : rules) {
            if (r.matches(path)) {
                rule = r;
                break;
            }
        }
        String k = rule == null ? null : key.apply(req);
        if (k == null) {
            chain.doFilter(request, response);
            return;
        }
        Decision d;
        Lease lease = null;
        if (leased.contains(rule.policy())) {
            try {
                Acquired a = limiter.acquire(k, rule.policy(), rule.cost());
                d = a.decision();
                lease = a.lease();
            } catch (ShardlimitException.InvalidArgument e) {
                // a reload made it a rate limit again
                leased.remove(rule.policy());
                d = limiter.check(k, rule.policy(), rule.cost());
            }
        } else {
            try {
                d = limiter.check(k, rule.policy(), rule.cost());
            } catch (ShardlimitException.InvalidArgument e) {
                if (!isConcurrency(rule.policy())) {
                    throw e;
                }
                // a concurrency policy: the request holds a lease until its response ends
                leased.add(rule.policy());
                Acquired a = limiter.acquire(k, rule.policy(), rule.cost());
                d = a.decision();
                lease = a.lease();
            }
        }
        req.setAttribute(DECISION_ATTRIBUTE, d);
        if (!d.allowed()) {
            deny(res, d);
            return;
        }
        for (Map.Entry<String, String> h : d.headers().entrySet()) {
            res.setHeader(h.getKey(), h.getValue());
        }
        if (lease == null) {
            chain.doFilter(request, response);
            return;
        }
        Lease held = lease;
        AtomicBoolean released = new AtomicBoolean();
        Runnable release = () -> {
            if (released.compareAndSet(false, true)) {
                limiter.releaseAsync(held);
            }
        };
        try {
            chain.doFilter(request, response);
        } finally {
            if (req.isAsyncStarted()) {
                req.getAsyncContext().addListener(new AsyncListener() {
                    @Override public void onComplete(AsyncEvent e) { release.run(); }
                    @Override public void onTimeout(AsyncEvent e) { release.run(); }
                    @Override public void onError(AsyncEvent e) { release.run(); }
                    @Override public void onStartAsync(AsyncEvent e) {}
                });
            } else {
                release.run();
            }
        }
    }

    private void deny(HttpServletResponse res, Decision d) throws IOException {
        deny(res, d, outageRetryAfter);
    }

    /**
     * The answer to a denial, as every middleware of shardlimit gives it: 429 with the core's
     * headers and JSON body, or 503 with {@code Retry-After: outageRetryAfter} and
     * {@code "error": "rate_limit_unavailable"} when the limit could not be checked.
     */
    public static void deny(HttpServletResponse res, Decision d, int outageRetryAfter) throws IOException {
        boolean outage = "fallback".equals(d.source());
        String body = d.body();
        if (outage) {
            Map<String, Object> payload = new LinkedHashMap<>(Json.object(body));
            payload.put("error", "rate_limit_unavailable");
            body = Json.write(payload);
        }
        res.setStatus(outage ? 503 : 429);
        for (Map.Entry<String, String> h : d.headers().entrySet()) {
            res.setHeader(h.getKey(), h.getValue());
        }
        if (outage) {
            res.setHeader("Retry-After", String.valueOf(outageRetryAfter));
        }
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        res.setContentType("application/json");
        res.setContentLength(bytes.length);
        res.getOutputStream().write(bytes);
    }
}
