import io.github.bucket4j.BucketConfiguration;
import io.github.bucket4j.distributed.AsyncBucketProxy;
import io.github.bucket4j.distributed.BucketProxy;
import io.github.bucket4j.distributed.ExpirationAfterWriteStrategy;
import io.github.bucket4j.redis.lettuce.Bucket4jLettuce;
import io.github.bucket4j.redis.lettuce.cas.LettuceBasedProxyManager;
import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.codec.ByteArrayCodec;
import io.shardlimit.Decision;
import io.shardlimit.Limiter;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.Locale;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One library, one run, for scripts/bench-java.sh (which alternates the libraries, pins this
 * JVM to CPU 0 and Redis to CPU 1):
 *
 * <pre>
 *   java -cp ... Bench --lib shardlimit|bucket4j --redis redis://127.0.0.1:PORT [--redis-pid PID]
 *        --mode throughput --keys 1000|1 [--concurrency 64] [--warmup-secs 3] [--secs 5]
 *        [--sequential 5000]
 *   java -cp ... Bench --lib ... --redis ... --mode exact [--limit 1000] [--requests 3000]
 * </pre>
 *
 * The policy in both libraries is a token bucket on Redis (shardlimit's token_bucket; Bucket4j's
 * bandwidth over Lettuce, its compare-and-swap proxy manager, the one Bucket4jLettuce builds).
 * throughput: a warm-up at the same load (connections, scripts, JIT), then {@code secs} of checks
 * with {@code concurrency} in flight (async APIs; 10^9 tokens, so every check is admitted) over
 * {@code keys} keys; then {@code sequential} blocking checks, one at a time, for p50/p99. Prints
 * one JSON line: decisions/s, this JVM's CPU per decision (every thread), Redis's CPU and its
 * script time, script calls and commands per decision (INFO commandstats, reset after the warm-up) over the
 * measured phase (see commandStats), and how many decisions did not come from Redis ({@code fallbacks}: shardlimit's
 * decisions whose source is not redis; {@code errors}: failed checks). The script fails a run that
 * had any. exact: {@code requests} checks with 64 in flight on one key of a bucket of {@code
 * limit} tokens that refills nothing during the run; prints how many were admitted.
 */
public final class Bench {
    static final long BIG = 1_000_000_000L;

    interface Lib extends AutoCloseable {
        CompletableFuture<Boolean> check(int key);

        boolean checkBlocking(int key);

        String version();

        @Override
        void close();
    }

    static final AtomicLong fallbacks = new AtomicLong();

    static Lib shardlimit(String url, String prefix, long capacity, double refillPerSec, int keys) {
        String cfg = String.format(Locale.ROOT,
                "{\"shards\":[{\"name\":\"bench\",\"url\":\"%s\"}],\"timeout_ms\":1000,"
                        + "\"policies\":{\"api\":{\"algorithm\":\"token_bucket\",\"capacity\":%d,\"refill_per_sec\":%s}}}",
                url, capacity, Double.toString(refillPerSec));
        Limiter limiter = Limiter.fromJson(cfg);
        String[] names = new String[keys];
        for (int i = 0; i < keys; i++) {
            names[i] = prefix + i;
        }
        return new Lib() {
            public CompletableFuture<Boolean> check(int key) {
                return limiter.checkAsync(names[key], "api").thenApply(Bench::counted);
            }

            public boolean checkBlocking(int key) {
                return counted(limiter.check(names[key], "api"));
            }

            public String version() {
                return "shardlimit " + Limiter.coreVersion();
            }

            public void close() {
                limiter.close();
            }
        };
    }

    /** A decision that did not come from Redis is counted (the run then fails), not measured. */
    static boolean counted(Decision d) {
        if (!d.source().equals("redis")) {
            fallbacks.incrementAndGet();
        }
        return d.allowed();
    }

    static Lib bucket4j(String url, String prefix, BucketConfiguration config, int keys) {
        RedisClient client = RedisClient.create(url);
        StatefulRedisConnection<byte[], byte[]> conn = client.connect(ByteArrayCodec.INSTANCE);
        // as Bucket4j's documentation configures it: keys expire once the bucket would be full
        LettuceBasedProxyManager<byte[]> pm = Bucket4jLettuce.casBasedBuilder(conn)
                .expirationAfterWrite(ExpirationAfterWriteStrategy.basedOnTimeForRefillingBucketUpToMax(Duration.ofSeconds(10)))
                .build();
        // one proxy per key, made once (a cache of them, as a service would keep)
        AsyncBucketProxy[] async = new AsyncBucketProxy[keys];
        BucketProxy[] sync = new BucketProxy[keys];
        for (int i = 0; i < keys; i++) {
            byte[] k = (prefix + i).getBytes(StandardCharsets.UTF_8);
            async[i] = pm.asAsync().builder().build(k, () -> CompletableFuture.completedFuture(config));
            sync[i] = pm.builder().build(k, () -> config);
        }
        return new Lib() {
            public CompletableFuture<Boolean> check(int key) {
                return async[key].tryConsume(1);
            }

            public boolean checkBlocking(int key) {
                return sync[key].tryConsume(1);
            }

            public String version() {
                return "Bucket4j " + jarVersion(BucketConfiguration.class) + " + Lettuce " + jarVersion(RedisClient.class);
            }

            public void close() {
                conn.close();
                client.shutdown(Duration.ZERO, Duration.ofSeconds(2));
            }
        };
    }

    /** The version in the name of the jar a class came from (artifact-VERSION.jar, as Maven names it). */
    static String jarVersion(Class<?> c) {
        String jar = Path.of(c.getProtectionDomain().getCodeSource().getLocation().getPath()).getFileName().toString();
        Matcher m = Pattern.compile("-(\\d[^-]*)\\.jar$").matcher(jar);
        return m.find() ? m.group(1) : jar;
    }

    /** Runs `n` checks (or until `deadlineNanos`) with `inFlight` at once; answers how many were admitted. */
    static long[] run(Lib lib, int keys, long n, long deadlineNanos, int inFlight) throws Exception {
        Semaphore permits = new Semaphore(inFlight);
        AtomicLong admitted = new AtomicLong();
        AtomicLong errors = new AtomicLong();
        AtomicReference<Throwable> first = new AtomicReference<>();
        long made = 0;
        for (long i = 0; i < n && (deadlineNanos == 0 || System.nanoTime() < deadlineNanos); i++) {
            permits.acquire();
            made++;
            lib.check((int) (i % keys)).whenComplete((ok, e) -> {
                if (e != null) {
                    errors.incrementAndGet();
                    first.compareAndSet(null, e);
                } else if (ok) {
                    admitted.incrementAndGet();
                }
                permits.release();
            });
        }
        permits.acquire(inFlight); // every check answered
        if (first.get() != null) {
            System.err.println("first error: " + first.get());
        }
        return new long[] {made, admitted.get(), errors.get()};
    }

    static long procCpuMicros(String pid) throws Exception {
        if (pid == null) {
            return 0;
        }
        String s = Files.readString(Path.of("/proc/" + pid + "/stat"));
        String[] f = s.substring(s.lastIndexOf(')') + 2).split(" ");
        return (Long.parseLong(f[11]) + Long.parseLong(f[12])) * 10_000; // USER_HZ = 100
    }

    static final Set<String> NOT_DECISIONS = Set.of("info", "config", "flushall", "script", "ping", "client",
            "hello", "select", "command", "auth");

    /**
     * Since the last CONFIG RESETSTAT: {the time of the script calls (EVAL, EVALSHA, FCALL and
     * their read-only forms: a script's time includes the commands it runs), how many script calls,
     * how many commands Redis executed (the scripts' own commands included; the bench's own
     * INFO and CONFIG and the clients' connection set-up excluded)}. (Bucket4j's GET before each
     * compare-and-swap script is outside the script time; Redis's CPU counts it.)
     */
    static long[] commandStats(RedisCommands<String, String> admin) {
        Matcher m = Pattern.compile("^cmdstat_([^:]+):calls=(\\d+),usec=(\\d+),", Pattern.MULTILINE)
                .matcher(admin.info("commandstats"));
        long scriptUsec = 0;
        long scriptCalls = 0;
        long calls = 0;
        while (m.find()) {
            String name = m.group(1).split("\\|")[0];
            if (NOT_DECISIONS.contains(name)) {
                continue;
            }
            calls += Long.parseLong(m.group(2));
            if (name.startsWith("eval") || name.startsWith("fcall")) {
                scriptCalls += Long.parseLong(m.group(2));
                scriptUsec += Long.parseLong(m.group(3));
            }
        }
        return new long[] {scriptUsec, scriptCalls, calls};
    }

    static String arg(String[] a, String name, String dflt) {
        for (int i = 0; i + 1 < a.length; i++) {
            if (a[i].equals("--" + name)) {
                return a[i + 1];
            }
        }
        if (dflt == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return dflt;
    }

    public static void main(String[] a) throws Exception {
        String libName = arg(a, "lib", null);
        String url = arg(a, "redis", null);
        String redisPid = arg(a, "redis-pid", "").isEmpty() ? null : arg(a, "redis-pid", "");
        String mode = arg(a, "mode", "throughput");
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        RedisClient adminClient = RedisClient.create(url);
        StatefulRedisConnection<String, String> adminConn = adminClient.connect();
        RedisCommands<String, String> admin = adminConn.sync();
        StringBuilder json = new StringBuilder();
        Lib lib;
        if (mode.equals("exact")) {
            long limit = Long.parseLong(arg(a, "limit", "1000"));
            long requests = Long.parseLong(arg(a, "requests", "3000"));
            // a bucket of `limit` that refills nothing during the run (shardlimit: one token per
            // 1000 s; Bucket4j: all of them at once after a day)
            lib = libName.equals("shardlimit")
                    ? shardlimit(url, "exact:", limit, 0.001, 1)
                    : bucket4j(url, "exact:", BucketConfiguration.builder()
                            .addLimit(l -> l.capacity(limit).refillIntervally(limit, Duration.ofDays(1))).build(), 1);
            long[] r = run(lib, 1, requests, 0, 64);
            json.append(String.format(Locale.ROOT,
                    "{\"lib\":\"%s\",\"version\":\"%s\",\"mode\":\"exact\",\"limit\":%d,\"requests\":%d,"
                            + "\"admitted\":%d,\"errors\":%d,\"fallbacks\":%d}",
                    libName, lib.version(), limit, r[0], r[1], r[2], fallbacks.get()));
        } else {
            int keys = Integer.parseInt(arg(a, "keys", "1000"));
            int concurrency = Integer.parseInt(arg(a, "concurrency", "64"));
            double warmSecs = Double.parseDouble(arg(a, "warmup-secs", "3"));
            double secs = Double.parseDouble(arg(a, "secs", "5"));
            int sequential = Integer.parseInt(arg(a, "sequential", "0"));
            String prefix = keys == 1 ? "hot:" : "user:";
            lib = libName.equals("shardlimit")
                    ? shardlimit(url, prefix, BIG, BIG / 3600.0, keys)
                    : bucket4j(url, prefix, BucketConfiguration.builder()
                            .addLimit(l -> l.capacity(BIG).refillGreedy(BIG, Duration.ofHours(1))).build(), keys);
            // warm-up: the same load, for the JIT (C2) and the connections
            long[] w = run(lib, keys, Long.MAX_VALUE, System.nanoTime() + (long) (warmSecs * 1e9), concurrency);
            admin.configResetstat();
            long cpu0 = os.getProcessCpuTime();
            long r0 = procCpuMicros(redisPid);
            long t0 = System.nanoTime();
            long[] m = run(lib, keys, Long.MAX_VALUE, t0 + (long) (secs * 1e9), concurrency);
            double elapsed = (System.nanoTime() - t0) / 1e9;
            double cpuUs = (os.getProcessCpuTime() - cpu0) / 1e3 / m[0];
            double redisCpuUs = redisPid == null ? 0 : (double) (procCpuMicros(redisPid) - r0) / m[0];
            long[] stats = commandStats(admin);
            long denied = (w[0] - w[1] - w[2]) + (m[0] - m[1] - m[2]);
            double p50 = 0;
            double p99 = 0;
            if (sequential > 0) {
                long[] lat = new long[sequential];
                for (int i = 0; i < sequential; i++) {
                    long s = System.nanoTime();
                    if (!lib.checkBlocking(i % keys)) {
                        denied++;
                    }
                    lat[i] = System.nanoTime() - s;
                }
                Arrays.sort(lat);
                p50 = lat[sequential / 2] / 1e3;
                p99 = lat[Math.min(sequential - 1, (int) (sequential * 0.99))] / 1e3;
            }
            json.append(String.format(Locale.ROOT,
                    "{\"lib\":\"%s\",\"version\":\"%s\",\"mode\":\"throughput\",\"keys\":%d,\"concurrency\":%d,"
                            + "\"decisions_per_sec\":%.1f,\"client_cpu_us\":%.3f,\"redis_cpu_us\":%.3f,"
                            + "\"redis_script_us\":%.3f,\"script_calls_per_decision\":%.3f,"
                            + "\"redis_commands_per_decision\":%.3f,"
                            + "\"p50_us\":%.1f,\"p99_us\":%.1f,\"measured\":%d,\"warmup\":%d,\"sequential\":%d,"
                            + "\"denied\":%d,\"errors\":%d,\"fallbacks\":%d,\"java\":\"%s\"}",
                    libName, lib.version(), keys, concurrency, m[0] / elapsed, cpuUs, redisCpuUs,
                    (double) stats[0] / m[0], (double) stats[1] / m[0], (double) stats[2] / m[0], p50, p99, m[0], w[0], sequential,
                    denied, w[2] + m[2], fallbacks.get(), System.getProperty("java.version")));
        }
        lib.close();
        adminConn.close();
        adminClient.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        System.out.println(json);
        System.exit(0); // (the libraries' non-daemon threads)
    }
}
