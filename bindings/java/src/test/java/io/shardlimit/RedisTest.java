package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.net.ServerSocket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** Decisions on a real redis-server: every limiter here has on_error: error, and checks `source`. */
class RedisTest {
    static RedisServer redis;
    static final String POLICIES = "{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":100,\"window\":\"1m\"},"
            + "\"conc\":{\"algorithm\":\"concurrency\",\"max\":2,\"lease_ttl\":\"30s\"}}";

    @BeforeAll
    static void start() throws Exception {
        redis = RedisServer.start();
    }

    @AfterAll
    static void stop() throws Exception {
        redis.close();
    }

    @Test
    void decisionsComeFromRedisAndCallbacksRunOnTheExecutor() throws Exception {
        ExecutorService exec = Executors.newFixedThreadPool(2, r -> {
            Thread t = new Thread(r, "test-callbacks");
            t.setDaemon(true);
            return t;
        });
        try (Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"rt1:\""))) {
            l.setExecutor(exec);
            assertTrue(l.isRedis());
            l.connect(Duration.ofSeconds(5));
            Decision d = l.check("k", "api");
            assertEquals("redis", d.source());
            assertEquals(99, d.remaining());
            assertEquals(0, d.shard().orElseThrow());
            // the completion waits on the executor until the callback is attached: a future
            // already complete when thenApply is called would run it on this thread
            CountDownLatch attached = new CountDownLatch(1);
            l.setExecutor(r -> exec.execute(() -> {
                try {
                    attached.await(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                r.run();
            }));
            CompletableFuture<String> thread = l.checkAsync("k", "api", 1)
                    .thenApply(x -> Thread.currentThread().getName());
            attached.countDown();
            assertEquals("test-callbacks", thread.get(10, TimeUnit.SECONDS));
            l.setExecutor(exec);
            assertEquals("s0", l.route("k").orElseThrow().name());
            // the state is in this server, under the config's prefix
            assertFalse(redis.cli("--scan", "--pattern", "rt1:*").isEmpty());
        } finally {
            exec.shutdownNow();
        }
    }

    @Test
    void manyCallsInFlightGiveExactTotals() throws Exception {
        try (Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"rt2:\""))) {
            List<CompletableFuture<Decision>> all = new ArrayList<>();
            for (int i = 0; i < 2000; i++) {
                all.add(l.checkAsync("hot" + (i % 4), "api", 1));
            }
            int allowed = 0;
            for (CompletableFuture<Decision> f : all) {
                Decision d = f.get(30, TimeUnit.SECONDS);
                assertEquals("redis", d.source());
                allowed += d.allowed() ? 1 : 0;
            }
            assertEquals(400, allowed);
        }
    }

    @Test
    void virtualThreadsBlockInJoinNotInNativeCode() throws Exception {
        // Java 21+: many virtual threads each making blocking calls on few carriers
        var ofVirtual = Thread.class.getMethods();
        boolean hasVirtual = java.util.Arrays.stream(ofVirtual).anyMatch(m -> m.getName().equals("ofVirtual"));
        org.junit.jupiter.api.Assumptions.assumeTrue(hasVirtual, "no virtual threads before Java 21");
        ExecutorService vt = (ExecutorService) Executors.class.getMethod("newVirtualThreadPerTaskExecutor").invoke(null);
        try (Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"rt3:\""))) {
            AtomicInteger allowed = new AtomicInteger();
            List<java.util.concurrent.Future<?>> fs = new ArrayList<>();
            for (int i = 0; i < 500; i++) {
                fs.add(vt.submit(() -> {
                    if (l.check("vt", "api").allowed()) {
                        allowed.incrementAndGet();
                    }
                }));
            }
            for (var f : fs) {
                f.get(30, TimeUnit.SECONDS);
            }
            assertEquals(100, allowed.get());
        } finally {
            vt.shutdown();
        }
    }

    @Test
    void leasesOnRedis() throws Exception {
        try (Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"rt4:\""))) {
            try (Lease a = l.acquire("k", "conc").lease(); Lease b = l.acquire("k", "conc").lease()) {
                assertNotNull(a);
                assertNotNull(b);
                var denied = l.acquire("k", "conc");
                assertFalse(denied.decision().allowed());
                assertEquals("redis", denied.decision().source());
            }
            assertTrue(l.acquire("k", "conc").decision().allowed());
        }
    }

    @Test
    void anUnreachableShardIsABackendErrorUnderOnErrorError() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
            port = s.getLocalPort();
        }
        String shards = "\"shards\":[{\"name\":\"s0\",\"url\":\"redis://127.0.0.1:" + port + "\"}],\"timeout_ms\":300";
        try (Limiter l = Limiter.fromJson("{" + shards + ",\"on_error\":\"error\",\"policies\":" + POLICIES + "}")) {
            var e = assertThrows(ShardlimitException.Backend.class, () -> l.check("k", "api"));
            assertTrue(e instanceof ShardlimitException.Connection || e instanceof ShardlimitException.Timeout
                    || e instanceof ShardlimitException.Unavailable, e.toString());
        }
        try (Limiter l = Limiter.fromJson("{" + shards + ",\"on_error\":\"open\",\"policies\":" + POLICIES + "}")) {
            Decision d = l.check("k", "api");
            assertTrue(d.allowed());
            assertEquals("fallback", d.source());
            assertEquals("unmeasured", d.headers().get("X-RateLimit-Status"));
        }
        try (Limiter l = Limiter.fromJson("{" + shards + ",\"on_error\":\"closed\",\"policies\":" + POLICIES + "}")) {
            Decision d = l.check("k", "api");
            assertFalse(d.allowed());
            assertEquals("fallback", d.source());
        }
    }

    @Test
    void eventsFromRedisDecisions() throws Exception {
        String policies = "{\"one\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1m\"}}";
        try (Limiter l = Limiter.fromJson(redis.config(policies, "\"key_prefix\":\"rt5:\""))) {
            var events = new LinkedBlockingQueue<Results.Event>();
            l.subscribe(events::add);
            assertTrue(l.check("k", "one").allowed());
            Decision d = l.check("k", "one");
            assertFalse(d.allowed());
            assertEquals("redis", d.source());
            Results.Event e;
            do {
                e = events.poll(10, TimeUnit.SECONDS);
                assertNotNull(e, "no denied event");
            } while (!e.kind().equals("denied"));
            assertEquals("denied", e.fields().get("kind"));
            assertEquals("one", e.fields().get("policy"));
        }
    }

    @Test
    void closeWithCallsInFlightCompletesThemAll() throws Exception {
        Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"rt6:\""));
        List<CompletableFuture<Decision>> all = new ArrayList<>();
        for (int i = 0; i < 500; i++) {
            all.add(l.checkAsync("c" + i, "api", 1));
        }
        l.close();
        for (CompletableFuture<Decision> f : all) {
            try {
                assertEquals("redis", f.get(30, TimeUnit.SECONDS).source());
            } catch (java.util.concurrent.ExecutionException e) {
                assertTrue(e.getCause() instanceof ShardlimitException, e.toString());
            }
        }
        assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("k", "api"));
    }
}
