package io.shardlimit;

import io.shardlimit.Results.Acquired;
import io.shardlimit.Results.BlockInfo;
import io.shardlimit.Results.Event;
import io.shardlimit.Results.Layer;
import io.shardlimit.Results.LogRecord;
import io.shardlimit.Results.ReloadReport;
import io.shardlimit.Results.Reservation;
import io.shardlimit.Results.Reserved;
import io.shardlimit.Results.Route;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * A rate limiter over the shardlimit core: in memory, or deciding on Redis shards.
 *
 * <p>Every call has an async form ({@code checkAsync}...) returning a {@link CompletableFuture}
 * and a blocking form ({@code check}...) that is the future's {@code join()}: no Java thread
 * waits inside native code for Redis, so a virtual thread is never pinned by a check. The
 * futures complete on the limiter's {@linkplain #setExecutor executor} (the common pool by
 * default), never on the core's I/O thread. On the in-memory engine a call never waits and
 * its future is complete when it returns.
 *
 * <p>Errors are {@link ShardlimitException}s, one subclass per kind of the core's error table.
 */
public final class Limiter implements AutoCloseable {
    private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();
    private long handle;
    private volatile Executor executor = ForkJoinPool.commonPool();

    private Limiter(long handle) {
        this.handle = handle;
        // the limiter's warning lines go to the JVM's System.Logger by default
        setLogSink(null);
    }

    // ----- construction ------------------------------------------------------------

    /** An in-memory limiter with no policies (the test double). */
    public static Limiter memory() {
        return memory(null);
    }

    public static Limiter memory(ManualClock clock) {
        return new Limiter(Native.memory(clockHandle(clock)));
    }

    /** A limiter from a JSON configuration (the format of docs/config.md). */
    public static Limiter fromJson(String json) {
        return fromJson(json, null);
    }

    /** A limiter from a JSON configuration, deciding on {@code clock} (tests, replays). */
    public static Limiter fromJson(String json, ManualClock clock) {
        return new Limiter(Native.fromJson(utf8(json, "config"), clockHandle(clock)));
    }

    /** A limiter from a JSON configuration file. */
    public static Limiter fromConfigFile(Path path) {
        return fromConfigFile(path, null);
    }

    public static Limiter fromConfigFile(Path path, ManualClock clock) {
        return new Limiter(Native.fromConfigFile(utf8(path.toString(), "path"), clockHandle(clock)));
    }

    /** A limiter from SHARDLIMIT_CONFIG (a path, or inline JSON); in memory when it is unset. */
    public static Limiter fromEnv() {
        return fromEnv(null);
    }

    public static Limiter fromEnv(ManualClock clock) {
        return new Limiter(Native.fromEnv(clockHandle(clock)));
    }

    private static long clockHandle(ManualClock c) {
        return c == null ? 0 : c.handle;
    }

    /** Where futures complete and events are delivered (the common pool by default). */
    public Limiter setExecutor(Executor executor) {
        this.executor = Objects.requireNonNull(executor, "executor");
        return this;
    }

    // ----- plumbing ----------------------------------------------------------------

    /**
     * UTF-8 bytes of a string argument. A string that is not valid Unicode (a lone surrogate)
     * is an invalid_argument error naming it, never silently replaced.
     */
    static byte[] utf8(String s, String what) {
        if (s == null) {
            throw new ShardlimitException.InvalidArgument(what + ": must not be null");
        }
        for (int k = 0; k < s.length(); k++) {
            if (Character.isSurrogate(s.charAt(k))) {
                try {
                    ByteBuffer b = StandardCharsets.UTF_8.newEncoder()
                            .onMalformedInput(CodingErrorAction.REPORT)
                            .onUnmappableCharacter(CodingErrorAction.REPORT)
                            .encode(CharBuffer.wrap(s));
                    byte[] out = new byte[b.remaining()];
                    b.get(out);
                    return out;
                } catch (CharacterCodingException e) {
                    throw new ShardlimitException.InvalidArgument(what + ": is not valid Unicode (a lone surrogate)");
                }
            }
        }
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static byte[] optUtf8(String s, String what) {
        return s == null ? null : utf8(s, what);
    }

    private static long micros(Duration d) {
        return micros(d, "ttl");
    }

    private static long micros(Duration d, String what) {
        if (d == null) {
            return -1;
        }
        if (d.isNegative()) {
            throw new ShardlimitException.InvalidArgument(what + ": must not be negative");
        }
        try {
            return Math.multiplyExact(d.getSeconds(), 1_000_000L) + d.getNano() / 1000;
        } catch (ArithmeticException e) {
            throw new ShardlimitException.InvalidArgument(what + ": too long");
        }
    }

    @FunctionalInterface
    private interface Start {
        void start(long handle, Call<?> call);
    }

    /** Starts a native call under the read lock (close waits for it to return). */
    private <T> CompletableFuture<T> call(Function<Object, T> convert, Start start) {
        Call<T> call = new Call<>(executor, convert);
        lock.readLock().lock();
        try {
            if (handle == 0) {
                throw new ShardlimitException.InvalidArgument("limiter: is closed");
            }
            start.start(handle, call);
        } catch (RuntimeException e) {
            call.completeExceptionally(e);
        } finally {
            lock.readLock().unlock();
        }
        return call;
    }

    private <T> T sync(Function<Long, T> f) {
        lock.readLock().lock();
        try {
            if (handle == 0) {
                throw new ShardlimitException.InvalidArgument("limiter: is closed");
            }
            return f.apply(handle);
        } finally {
            lock.readLock().unlock();
        }
    }

    // test hooks (package-private): raw native calls on this limiter's handle
    private Call<?> last;

    Call<?> newCall() {
        last = new Call<>(executor, o -> o);
        return last;
    }

    void withHandle(java.util.function.LongConsumer f) {
        sync(h -> {
            f.accept(h);
            return null;
        });
    }

    Call<?> lastCall(Runnable r) {
        try {
            r.run();
        } catch (RuntimeException e) {
            last.completeExceptionally(e);
        }
        return last;
    }

    private static Decision decision(Object o) {
        return (Decision) o;
    }

    private CompletableFuture<Decision> decide(String key, String policy, String plan, long n, int mode) {
        byte[] k = utf8(key, "key");
        byte[] p = utf8(policy, "policy");
        byte[] pl = optUtf8(plan, "plan");
        return call(Limiter::decision, (h, c) -> Native.check(h, k, p, pl, n, mode, c));
    }

    // ----- checks ------------------------------------------------------------------

    /** Takes one unit of {@code policy}'s limit for {@code key}, or is denied. */
    public Decision check(String key, String policy) {
        return check(key, policy, 1);
    }

    /** Takes {@code cost} units of {@code policy}'s limit for {@code key}, or is denied. */
    public Decision check(String key, String policy, long cost) {
        return Call.await(checkAsync(key, policy, cost));
    }

    public CompletableFuture<Decision> checkAsync(String key, String policy) {
        return checkAsync(key, policy, 1);
    }

    public CompletableFuture<Decision> checkAsync(String key, String policy, long cost) {
        return decide(key, policy, null, cost, Native.CHECK);
    }

    /** A check of the config's policy {@code policy} as plan {@code plan} has it. */
    public Decision checkPlan(String key, String plan, String policy, long cost) {
        return Call.await(checkPlanAsync(key, plan, policy, cost));
    }

    public CompletableFuture<Decision> checkPlanAsync(String key, String plan, String policy, long cost) {
        return decide(key, policy, Objects.requireNonNull(plan, "plan"), cost, Native.CHECK);
    }

    /** The decision a check would make, consuming nothing. */
    public Decision peek(String key, String policy) {
        return Call.await(peekAsync(key, policy));
    }

    public CompletableFuture<Decision> peekAsync(String key, String policy) {
        return decide(key, policy, null, 0, Native.PEEK);
    }

    public Decision peekPlan(String key, String plan, String policy) {
        return Call.await(decide(key, policy, Objects.requireNonNull(plan, "plan"), 0, Native.PEEK));
    }

    /** A check in shadow mode for this call: a would-be denial is allowed, and marked. */
    public Decision checkShadow(String key, String policy, long cost) {
        return Call.await(checkShadowAsync(key, policy, cost));
    }

    public CompletableFuture<Decision> checkShadowAsync(String key, String policy, long cost) {
        return decide(key, policy, null, cost, Native.SHADOW);
    }

    /** Forgets {@code key}'s state under {@code policy}. */
    public void reset(String key, String policy) {
        Call.await(resetAsync(key, policy));
    }

    public CompletableFuture<Void> resetAsync(String key, String policy) {
        return decide(key, policy, null, 0, Native.RESET).thenApply(d -> null);
    }

    /** A layered check: allowed only if every layer allows; if one denies, none consumes. */
    public Decision checkAll(List<Layer> layers) {
        return Call.await(checkAllAsync(layers));
    }

    public CompletableFuture<Decision> checkAllAsync(List<Layer> layers) {
        int n = layers.size();
        byte[][] keys = new byte[n][];
        byte[][] policies = new byte[n][];
        long[] costs = new long[n];
        for (int k = 0; k < n; k++) {
            Layer l = layers.get(k);
            keys[k] = utf8(l.key(), "layers[" + k + "].key");
            policies[k] = utf8(l.policy(), "layers[" + k + "].policy");
            costs[k] = l.cost();
        }
        return call(Limiter::decision, (h, c) -> Native.checkAll(h, keys, policies, costs, c));
    }

    // ----- leases ------------------------------------------------------------------

    /** Takes {@code units} of a concurrency policy: a lease to release (or close) when done. */
    public Acquired acquire(String key, String policy, long units) {
        return Call.await(acquireAsync(key, policy, units));
    }

    public Acquired acquire(String key, String policy) {
        return acquire(key, policy, 1);
    }

    public CompletableFuture<Acquired> acquireAsync(String key, String policy, long units) {
        byte[] k = utf8(key, "key");
        byte[] p = utf8(policy, "policy");
        return call(o -> {
            Object[] pair = (Object[]) o;
            Lease lease = null;
            if (pair[1] != null) {
                Map<String, Object> m = Json.object((String) pair[1]);
                lease = new Lease(this, (String) m.get("key"), (String) m.get("policy"), (String) m.get("id"),
                        (Long) m.get("units"));
            }
            return new Acquired((Decision) pair[0], lease);
        }, (h, c) -> Native.acquire(h, k, p, units, c));
    }

    /** Gives a lease back; false when it was no longer held (released before, or expired). */
    public boolean release(Lease lease) {
        return Call.await(releaseAsync(lease));
    }

    public CompletableFuture<Boolean> releaseAsync(Lease lease) {
        byte[] k = utf8(lease.key(), "lease.key");
        byte[] p = utf8(lease.policy(), "lease.policy");
        byte[] id = utf8(lease.id(), "lease.id");
        return call(o -> "true".equals(o), (h, c) -> Native.release(h, k, p, id, lease.units(), c));
    }

    // ----- charge, refund, reserve, settle ----------------------------------------

    /** Consumes units without ever denying (the key may go into debt). */
    public Decision charge(String key, String policy, long cost) {
        return Call.await(chargeAsync(key, policy, cost));
    }

    public CompletableFuture<Decision> chargeAsync(String key, String policy, long cost) {
        return decide(key, policy, null, cost, Native.CHARGE);
    }

    /** Gives units back, never above the limit. */
    public Decision refund(String key, String policy, long cost) {
        return Call.await(refundAsync(key, policy, cost));
    }

    public CompletableFuture<Decision> refundAsync(String key, String policy, long cost) {
        return decide(key, policy, null, cost, Native.REFUND);
    }

    /** A check of an estimated cost, with a reservation to settle at the actual cost. */
    public Reserved reserve(String key, String policy, long estimate) {
        return Call.await(reserveAsync(key, policy, estimate));
    }

    public CompletableFuture<Reserved> reserveAsync(String key, String policy, long estimate) {
        byte[] k = utf8(key, "key");
        byte[] p = utf8(policy, "policy");
        return call(o -> {
            Object[] pair = (Object[]) o;
            Reservation r = null;
            if (pair[1] != null) {
                Map<String, Object> m = Json.object((String) pair[1]);
                r = new Reservation((String) m.get("key"), (String) m.get("policy"), (Long) m.get("units"),
                        (Long) m.get("at_us"));
            }
            return new Reserved((Decision) pair[0], r);
        }, (h, c) -> Native.reserve(h, k, p, estimate, c));
    }

    /** Settles a reservation at its actual cost: the unused part goes back. */
    public Decision settle(Reservation reservation, long actual) {
        return Call.await(settleAsync(reservation, actual));
    }

    public CompletableFuture<Decision> settleAsync(Reservation r, long actual) {
        byte[] k = utf8(r.key(), "reservation.key");
        byte[] p = utf8(r.policy(), "reservation.policy");
        return call(Limiter::decision, (h, c) -> Native.settle(h, k, p, r.units(), r.atMicros(), actual, c));
    }

    // ----- block list --------------------------------------------------------------

    /** Puts a key on the block list, for {@code ttl} (null: until unblocked), with a reason. */
    public void block(String key, Duration ttl, String reason) {
        Call.await(blockAsync(key, ttl, reason));
    }

    public CompletableFuture<Void> blockAsync(String key, Duration ttl, String reason) {
        byte[] k = utf8(key, "key");
        byte[] why = optUtf8(reason, "reason");
        long t = micros(ttl);
        return call(o -> null, (h, c) -> Native.blockList(h, Native.BLOCK, k, why, t, c));
    }

    /** Takes a key off the block list; false when it was not on it. */
    public boolean unblock(String key) {
        return Call.await(unblockAsync(key));
    }

    public CompletableFuture<Boolean> unblockAsync(String key) {
        byte[] k = utf8(key, "key");
        return call(o -> (Boolean) Json.parse((String) o), (h, c) -> Native.blockList(h, Native.UNBLOCK, k, null, -1, c));
    }

    /** Whether a key is blocked, why and for how long. */
    public Optional<BlockInfo> blocked(String key) {
        return Call.await(blockedAsync(key));
    }

    public CompletableFuture<Optional<BlockInfo>> blockedAsync(String key) {
        byte[] k = utf8(key, "key");
        return call(o -> {
            Object v = Json.parse((String) o);
            if (v == null) {
                return Optional.empty();
            }
            @SuppressWarnings("unchecked")
            Map<String, Object> m = (Map<String, Object>) v;
            Number left = (Number) m.get("remaining_ms");
            return Optional.of(new BlockInfo((String) m.get("reason"), left == null ? null : left.doubleValue()));
        }, (h, c) -> Native.blockList(h, Native.BLOCKED, k, null, -1, c));
    }

    // ----- overrides and the shadow report -----------------------------------------

    private CompletableFuture<Object> admin(int op, String key, String policy, String limit, long n) {
        byte[] k = optUtf8(key, "key");
        byte[] p = utf8(policy, "policy");
        byte[] l = optUtf8(limit, "limit");
        return call(o -> Json.parse((String) o), (h, c) -> Native.admin(h, op, k, p, l, n, c));
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> map(Object o) {
        return (Map<String, Object>) o;
    }

    /**
     * Sets {@code key}'s override of {@code policy} to {@code limit} (a rate string such as
     * {@code "100/minute"}, or a limit object in JSON), for {@code ttl} (null: until deleted).
     * Answers the override as {@code {key, policy, limit, remaining_ms}}.
     */
    public Map<String, Object> setOverride(String key, String policy, String limit, Duration ttl) {
        return Call.await(setOverrideAsync(key, policy, limit, ttl));
    }

    public CompletableFuture<Map<String, Object>> setOverrideAsync(String key, String policy, String limit,
            Duration ttl) {
        Objects.requireNonNull(key, "key");
        return admin(Native.SET_OVERRIDE, key, policy, Objects.requireNonNull(limit, "limit"), micros(ttl))
                .thenApply(Limiter::map);
    }

    /** A key's override of a policy, if it has one. */
    public Optional<Map<String, Object>> getOverride(String key, String policy) {
        return Call.await(getOverrideAsync(key, policy));
    }

    public CompletableFuture<Optional<Map<String, Object>>> getOverrideAsync(String key, String policy) {
        Objects.requireNonNull(key, "key");
        return admin(Native.GET_OVERRIDE, key, policy, null, 0).thenApply(o -> Optional.ofNullable(map(o)));
    }

    /** Deletes a key's override; false when it had none. */
    public boolean deleteOverride(String key, String policy) {
        return Call.await(deleteOverrideAsync(key, policy));
    }

    public CompletableFuture<Boolean> deleteOverrideAsync(String key, String policy) {
        Objects.requireNonNull(key, "key");
        return admin(Native.DELETE_OVERRIDE, key, policy, null, 0).thenApply(o -> (Boolean) o);
    }

    /**
     * One page of a policy's overrides: {@code {overrides: [...], cursor}}; pass the cursor
     * (null first) to get the next page, until it is null.
     */
    public Map<String, Object> listOverrides(String policy, String cursor, int limit) {
        return Call.await(listOverridesAsync(policy, cursor, limit));
    }

    public CompletableFuture<Map<String, Object>> listOverridesAsync(String policy, String cursor, int limit) {
        return admin(Native.LIST_OVERRIDES, cursor, policy, null, limit).thenApply(Limiter::map);
    }

    /** Shadow-mode denials of a policy by key, most first: {@code {policy, total, untracked, keys}}. */
    public Map<String, Object> shadowReport(String policy, Integer top) {
        return Call.await(shadowReportAsync(policy, top));
    }

    public CompletableFuture<Map<String, Object>> shadowReportAsync(String policy, Integer top) {
        return admin(Native.SHADOW_REPORT, null, policy, null, top == null ? -1 : top).thenApply(Limiter::map);
    }

    // ----- the limiter's state -----------------------------------------------------

    /** Connects to every shard and loads the scripts within {@code timeout}. */
    public void connect(Duration timeout) {
        Call.await(connectAsync(timeout));
    }

    public CompletableFuture<Void> connectAsync(Duration timeout) {
        long t = micros(Objects.requireNonNull(timeout, "timeout"));
        return call(o -> null, (h, c) -> Native.connect(h, t, c));
    }

    private String info(int what, String a, String b) {
        byte[] x = optUtf8(a, "argument");
        byte[] y = optUtf8(b, "argument");
        return sync(h -> Native.info(h, what, x, y));
    }

    private Map<String, Object> state() {
        return Json.object(info(Native.INFO_STATE, null, null));
    }

    /** The configuration in effect (without shard URLs, which may carry passwords). */
    public Map<String, Object> config() {
        return Json.object(info(Native.INFO_CONFIG, null, null));
    }

    /** How many reloads are in force (0 at first). */
    public long configGeneration() {
        return (Long) state().get("config_generation");
    }

    /** Whether decisions run on Redis (true) or in memory (false). */
    public boolean isRedis() {
        return (Boolean) state().get("is_redis");
    }

    /** How many keys the in-memory engine holds (empty on Redis). */
    public OptionalLong memoryKeys() {
        Long n = (Long) state().get("memory_keys");
        return n == null ? OptionalLong.empty() : OptionalLong.of(n);
    }

    /** The names of the configured policies. */
    @SuppressWarnings("unchecked")
    public List<String> policies() {
        return (List<String>) state().get("policies");
    }

    /** A configured policy: {@code {name, algorithm, params, max, on_error}}. */
    public Map<String, Object> policy(String name) {
        return Json.object(info(Native.INFO_POLICY, Objects.requireNonNull(name, "name"), null));
    }

    /** The policy in force under a plan of the config. */
    public Map<String, Object> planPolicy(String plan, String policy) {
        return Json.object(info(Native.INFO_PLAN_POLICY, Objects.requireNonNull(plan, "plan"),
                Objects.requireNonNull(policy, "policy")));
    }

    /** The shard {@code key} routes to (empty in memory). */
    public Optional<Route> route(String key) {
        Object v = Json.parse(info(Native.INFO_ROUTE, Objects.requireNonNull(key, "key"), null));
        if (v == null) {
            return Optional.empty();
        }
        Map<String, Object> m = map(v);
        return Optional.of(new Route(((Long) m.get("index")).intValue(), (String) m.get("name")));
    }

    /** The counters per policy as Prometheus text. */
    public String metrics() {
        return info(Native.INFO_METRICS, null, null);
    }

    /** The counters per policy, and the Redis latency histogram, as a map. */
    public Map<String, Object> metricsSnapshot() {
        return Json.object(info(Native.INFO_METRICS_SNAPSHOT, null, null));
    }

    /** Applies a new configuration (JSON), keeping connections and counters where they apply. */
    public ReloadReport reload(String json) {
        byte[] b = utf8(json, "config");
        return ReloadReport.of(sync(h -> Native.reload(h, b, false)));
    }

    public ReloadReport reloadFromFile(Path path) {
        byte[] b = utf8(path.toString(), "path");
        return ReloadReport.of(sync(h -> Native.reload(h, b, true)));
    }

    /** Reloads whenever {@code path} changes (checked every {@code every}), until the watcher is closed. */
    public ConfigWatcher watchConfig(Path path, Duration every) {
        byte[] b = utf8(path.toString(), "path");
        long us = micros(every);
        return new ConfigWatcher(sync(h -> Native.watchConfig(h, b, us)));
    }

    /** Scales the limits of {@code policies} (none: all) by {@code factor}. */
    public void setScale(double factor, String... policies) {
        byte[][] names = policies.length == 0 ? null : new byte[policies.length][];
        for (int k = 0; k < policies.length; k++) {
            names[k] = utf8(policies[k], "policies[" + k + "]");
        }
        sync(h -> Native.scale(h, factor, names, false));
    }

    /** The global scale factor in effect. */
    public double scale() {
        return ((Number) state().get("scale")).doubleValue();
    }

    /**
     * Installs the latency hook that {@link #observeHealth(Duration)} feeds: full limits while the
     * observed latency (a dependency's p99, say) is at or under {@code target}, {@code target /
     * latency} of them above it, never below {@code minFactor} (0 to 1). Node's {@code
     * setLatencyScale} and Python's {@code set_latency_scale} install the same hook.
     */
    public void setLatencyScale(Duration target, double minFactor) {
        if (target == null || target.isNegative()) {
            throw new ShardlimitException.InvalidArgument("target: must be a duration of zero or more, got " + target);
        }
        long us = micros(target, "target");
        sync(h -> {
            Native.latencyScale(h, us, minFactor);
            return null;
        });
    }

    /**
     * Feeds an observed latency to the hook {@link #setLatencyScale} installed and applies the
     * factor it answers; answers the factor now in force. Without a hook: an invalid_argument
     * error naming scale_hook.
     */
    public double observeHealth(Duration latency) {
        if (latency == null) {
            throw new ShardlimitException.InvalidArgument("latency: must not be null");
        }
        return observeHealth(latency.getSeconds() + latency.getNano() / 1e9);
    }

    /**
     * {@link #observeHealth(Duration)} with the signal as a number, in the core's unit: seconds
     * for the latency hook (as Python's {@code observe_health}; Node's {@code observeHealth}
     * takes milliseconds, as its {@code setLatencyScale} does).
     */
    public double observeHealth(double seconds) {
        return sync(h -> Native.scale(h, seconds, null, true));
    }

    /** Receives events as they happen, on the limiter's executor (at most 1024 queued; more are dropped). */
    public void subscribe(Consumer<Event> listener) {
        Objects.requireNonNull(listener, "listener");
        Native.Sink sink = new Native.Sink(() -> executor,
                (kind, json) -> listener.accept(new Event(kind, Json.object(json))));
        sync(h -> {
            Native.subscribe(h, sink);
            return null;
        });
    }

    /** Where the limiter's warning lines go (null: the JVM's System.Logger "shardlimit"). */
    public void setLogSink(Consumer<LogRecord> sink) {
        Consumer<LogRecord> target = sink != null ? sink : Limiter::toSystemLogger;
        Native.Sink s = new Native.Sink(() -> executor, (kind, json) -> target.accept(LogRecord.of(json)));
        sync(h -> {
            Native.setLogSink(h, s);
            return null;
        });
    }

    private static void toSystemLogger(LogRecord r) {
        System.Logger log = System.getLogger("shardlimit");
        System.Logger.Level level = switch (r.level()) {
            case "error" -> System.Logger.Level.ERROR;
            case "info" -> System.Logger.Level.INFO;
            default -> System.Logger.Level.WARNING;
        };
        log.log(level, r.message());
    }

    /**
     * Lets go of the engine: later calls fail with invalid_argument; connections close once
     * the calls in flight have finished.
     */
    @Override
    public void close() {
        lock.writeLock().lock();
        try {
            long h = handle;
            handle = 0;
            if (h != 0) {
                Native.free(h);
            }
        } finally {
            lock.writeLock().unlock();
        }
    }

    /** The rate-limit key part of a client: its address behind {@code trustedProxies} (CIDRs). */
    public static String clientIpKey(String peer, String xForwardedFor, List<String> trustedProxies, int ipv6Prefix) {
        byte[][] cidrs = new byte[trustedProxies.size()][];
        for (int k = 0; k < cidrs.length; k++) {
            cidrs[k] = utf8(trustedProxies.get(k), "trustedProxies[" + k + "]");
        }
        return Native.clientIpKey(utf8(peer, "peer"), optUtf8(xForwardedFor, "x_forwarded_for"), cidrs, ipv6Prefix);
    }

    /** The version of the core the native library was built from. */
    public static String coreVersion() {
        return (String) Json.object(Native.errorKinds()).get("version");
    }
}
