package io.shardlimit;

import java.util.List;
import java.util.Map;

/** Small result types of the limiter's calls. */
public final class Results {
    private Results() {}

    /** The answer to {@link Limiter#acquire}: the decision, and the lease when allowed (else null). */
    public record Acquired(Decision decision, Lease lease) {}

    /** Units reserved by {@link Limiter#reserve}: settle them once with the actual cost. */
    public record Reservation(String key, String policy, long units, long atMicros) {}

    /** The answer to {@link Limiter#reserve}: the decision, and the reservation when allowed. */
    public record Reserved(Decision decision, Reservation reservation) {}

    /** One layer of a layered check ({@link Limiter#checkAll}). */
    public record Layer(String key, String policy, long cost) {
        public Layer(String key, String policy) {
            this(key, policy, 1);
        }
    }

    /** The shard a key routes to. */
    public record Route(int index, String name) {}

    /** What a reload changed. */
    public record ReloadReport(boolean engineChanged, boolean handoff, List<String> policiesAdded,
            List<String> policiesRemoved, List<String> policiesChanged) {
        @SuppressWarnings("unchecked")
        static ReloadReport of(String json) {
            Map<String, Object> m = Json.object(json);
            return new ReloadReport((Boolean) m.get("engine_changed"), (Boolean) m.get("handoff"),
                    (List<String>) m.get("policies_added"), (List<String>) m.get("policies_removed"),
                    (List<String>) m.get("policies_changed"));
        }
    }

    /** A key on the block list: why, and for how long still (null: until unblocked). */
    public record BlockInfo(String reason, Double remainingMillis) {}

    /**
     * An event of the limiter: its kind (denied, blocked, fallback, circuit, shadow_denied,
     * near_limit, reloaded, reload_rejected) and its fields as the core names them (the
     * first is {@code kind}).
     */
    public record Event(String kind, Map<String, Object> fields) {}

    /** One of the limiter's rate-limited warning lines (fallbacks, circuits opened...). */
    public record LogRecord(String level, String reason, String subject, String errorKind, String message,
            long suppressed) {
        static LogRecord of(String json) {
            Map<String, Object> m = Json.object(json);
            return new LogRecord((String) m.get("level"), (String) m.get("reason"), (String) m.get("subject"),
                    (String) m.get("error_kind"), (String) m.get("message"), (Long) m.get("suppressed"));
        }
    }
}
