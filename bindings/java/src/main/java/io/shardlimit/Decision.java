package io.shardlimit;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalInt;

/**
 * The answer to a check: whether it was allowed, and the limit's state. Durations are whole
 * microseconds, as the core has them ({@link #resetAfterMicros()}...), and as
 * {@link Duration}s. {@link #headers()} and {@link #body()} are rendered by the core, the same
 * in every language.
 */
public final class Decision {
    private static final String[] SOURCES = {"redis", "memory", "local", "fallback", "block", "local_fallback"};

    private final boolean allowed;
    private final long limit;
    private final long remaining;
    private final long resetAfterUs;
    private final long retryAfterUs;
    private final long delayUs;
    private final String policy;
    private final int source;
    private final int shard;
    private final int layer;
    private final boolean shadowDenied;
    private final int limitIndex;
    private final long[] quotas;
    private final long windowUs;

    /** Made by the native library only. */
    Decision(boolean allowed, long limit, long remaining, long resetAfterUs, long retryAfterUs, long delayUs,
            String policy, int source, int shard, int layer, boolean shadowDenied, int limitIndex, long[] quotas,
            long windowUs) {
        this.allowed = allowed;
        this.limit = limit;
        this.remaining = remaining;
        this.resetAfterUs = resetAfterUs;
        this.retryAfterUs = retryAfterUs;
        this.delayUs = delayUs;
        this.policy = policy;
        this.source = source;
        this.shard = shard;
        this.layer = layer;
        this.shadowDenied = shadowDenied;
        this.limitIndex = limitIndex;
        this.quotas = quotas;
        this.windowUs = windowUs;
    }

    public boolean allowed() { return allowed; }

    public long limit() { return limit; }

    public long remaining() { return remaining; }

    public long resetAfterMicros() { return resetAfterUs; }

    public Duration resetAfter() { return Duration.ofNanos(resetAfterUs * 1000); }

    /** -1 when absent (allowed, or a request that can never fit). */
    public long retryAfterMicros() { return retryAfterUs; }

    public Optional<Duration> retryAfter() {
        return retryAfterUs < 0 ? Optional.empty() : Optional.of(Duration.ofNanos(retryAfterUs * 1000));
    }

    /** How long to wait before going ahead (leaky bucket in delay mode), else 0. */
    public long delayMicros() { return delayUs; }

    public Duration delay() { return Duration.ofNanos(delayUs * 1000); }

    /** The policy that decided. */
    public String policy() { return policy; }

    /** Who decided: redis, memory, local, fallback, block or local_fallback. */
    public String source() { return SOURCES[source]; }

    public OptionalInt shard() { return shard < 0 ? OptionalInt.empty() : OptionalInt.of(shard); }

    /** The layer of a layered check this decision describes. */
    public OptionalInt layer() { return layer < 0 ? OptionalInt.empty() : OptionalInt.of(layer); }

    /** A denial in shadow mode: allowed, but the limit would have denied it. */
    public boolean shadowDenied() { return shadowDenied; }

    /** Which limit of a multi-limit policy decided. */
    public OptionalInt limitIndex() { return limitIndex < 0 ? OptionalInt.empty() : OptionalInt.of(limitIndex); }

    /** One limit of a multi-limit decision. */
    public record Quota(long limit, long windowMicros) {}

    /** Every limit of a multi-limit policy (empty otherwise). */
    public List<Quota> quotas() {
        if (quotas == null) {
            return List.of();
        }
        List<Quota> l = new ArrayList<>();
        for (int k = 0; k + 1 < quotas.length; k += 2) {
            l.add(new Quota(quotas[k], quotas[k + 1]));
        }
        return Collections.unmodifiableList(l);
    }

    public long windowMicros() { return windowUs; }

    /** The standard rate-limit response headers, in the core's order. */
    public Map<String, String> headers() {
        String[] kv = (String[]) render(false);
        Map<String, String> m = new LinkedHashMap<>();
        for (int k = 0; k + 1 < kv.length; k += 2) {
            m.put(kv[k], kv[k + 1]);
        }
        return Collections.unmodifiableMap(m);
    }

    /** The 429 body: {@code {"error":"rate_limited","policy",...}} as JSON text. */
    public String body() {
        return ((String[]) render(true))[0];
    }

    private Object render(boolean body) {
        return Native.render(allowed, limit, remaining, resetAfterUs, retryAfterUs, policy, source, shadowDenied,
                limitIndex, quotas, windowUs, body);
    }

    @Override
    public String toString() {
        return "Decision{allowed=" + allowed + ", limit=" + limit + ", remaining=" + remaining + ", resetAfterUs="
                + resetAfterUs + ", retryAfterUs=" + retryAfterUs + ", policy=" + policy + ", source=" + source()
                + (layer >= 0 ? ", layer=" + layer : "") + (shadowDenied ? ", shadowDenied" : "") + "}";
    }
}
