package io.shardlimit;

/**
 * A concurrency lease from {@link Limiter#acquire}: units of a concurrency policy held until
 * released (or expired after the policy's lease_ttl). {@link #close()} releases it, so a
 * try-with-resources block holds the slot for its body.
 */
public final class Lease implements AutoCloseable {
    private final Limiter limiter;
    private final String key;
    private final String policy;
    private final String id;
    private final long units;

    Lease(Limiter limiter, String key, String policy, String id, long units) {
        this.limiter = limiter;
        this.key = key;
        this.policy = policy;
        this.id = id;
        this.units = units;
    }

    public String key() { return key; }

    public String policy() { return policy; }

    public String id() { return id; }

    public long units() { return units; }

    Limiter limiter() { return limiter; }

    /** Releases the lease (a second release is a no-op answering false). */
    @Override
    public void close() {
        limiter.release(this);
    }

    @Override
    public String toString() {
        return "Lease{key=" + key + ", policy=" + policy + ", id=" + id + ", units=" + units + "}";
    }
}
