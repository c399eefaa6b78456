package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlimit.Results.Acquired;
import io.shardlimit.Results.Layer;
import io.shardlimit.Results.Reserved;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The API on the in-memory engine with a manual clock. */
class LimiterTest {
    static final String POLICIES = "{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":2,\"window\":\"1s\"},"
            + "\"conc\":{\"algorithm\":\"concurrency\",\"max\":1,\"lease_ttl\":\"10s\"},"
            + "\"tb\":{\"algorithm\":\"token_bucket\",\"capacity\":10,\"refill_per_sec\":1},"
            + "\"ov\":{\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1m\",\"overrides\":true}}";

    static Limiter memory(ManualClock clock) {
        return Limiter.fromJson("{\"policies\":" + POLICIES + "}", clock);
    }

    @Test
    void checkDeniesPastTheLimitAndRendersHeadersAndBody() {
        ManualClock clock = new ManualClock(1_800_000_000_000_000L);
        try (Limiter l = memory(clock)) {
            assertFalse(l.isRedis());
            Decision a = l.check("k", "api");
            assertTrue(a.allowed());
            assertEquals("memory", a.source());
            assertEquals(1, a.remaining());
            assertEquals(1_000_000, a.resetAfterMicros());
            assertTrue(l.check("k", "api").allowed());
            clock.advanceMicros(250_000);
            Decision d = l.check("k", "api");
            assertFalse(d.allowed());
            assertEquals(750_000, d.retryAfterMicros());
            assertEquals(Duration.ofMillis(750), d.retryAfter().orElseThrow());
            Map<String, String> h = d.headers();
            assertEquals("2", h.get("X-RateLimit-Limit"));
            assertEquals("0", h.get("X-RateLimit-Remaining"));
            assertEquals("1", h.get("Retry-After"));
            Map<String, Object> body = Json.object(d.body());
            assertEquals("rate_limited", body.get("error"));
            assertEquals("api", body.get("policy"));
            assertEquals(1L, body.get("retry_after"));
            // peek consumes nothing
            assertEquals(0, l.peek("k", "api").remaining());
            clock.advanceMicros(750_000);
            assertEquals(2, l.peek("k", "api").remaining());
        }
    }

    @Test
    void asyncCallsOnMemoryAreCompleteAtOnce() {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            var f = l.checkAsync("k", "api", 1);
            assertTrue(f.isDone());
            assertTrue(f.join().allowed());
        }
    }

    @Test
    void errorsAreTypedByKind() {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            var e = assertThrows(ShardlimitException.UnknownPolicy.class, () -> l.check("k", "nope"));
            assertEquals("unknown_policy", e.kind());
            assertEquals(7, e.code());
            assertTrue(e.getMessage().contains("nope"), e.getMessage());
            var empty = assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("", "api"));
            assertEquals("invalid_argument", empty.kind());
            assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("k", "api", -1));
            // a key that is not valid Unicode is refused, never replaced by '?'
            var bad = assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("a\uD800b", "api"));
            assertTrue(bad.getMessage().contains("key"), bad.getMessage());
            // the async form fails its future with the same exception
            var f = l.checkAsync("k", "nope", 1);
            var ce = assertThrows(java.util.concurrent.CompletionException.class, f::join);
            assertTrue(ce.getCause() instanceof ShardlimitException.UnknownPolicy);
        }
        assertThrows(ShardlimitException.Config.class, () -> Limiter.fromJson("{\"policies\":{\"p\":{}}}"));
        assertThrows(ShardlimitException.Config.class, () -> Limiter.fromJson("not json"));
        assertThrows(ShardlimitException.Io.class,
                () -> Limiter.fromConfigFile(java.nio.file.Path.of("/nonexistent/shardlimit.json")));
    }

    @Test
    void panicsBecomeInternalErrors() {
        var e = assertThrows(ShardlimitException.Internal.class, Native::panicForTest);
        assertTrue(e.getMessage().contains("a test panic"), e.getMessage());
        assertEquals(9, e.code());
    }

    @Test
    void aClosedLimiterRefusesCalls() {
        Limiter l = memory(null);
        l.close();
        l.close();
        var e = assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("k", "api"));
        assertTrue(e.getMessage().contains("closed"), e.getMessage());
    }

    @Test
    void leasesAreReleasedByClose() {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            Acquired a = l.acquire("k", "conc");
            assertTrue(a.decision().allowed());
            assertNotNull(a.lease());
            try (Lease lease = a.lease()) {
                Acquired b = l.acquire("k", "conc");
                assertFalse(b.decision().allowed());
                assertNull(b.lease());
                assertEquals("conc", lease.policy());
            }
            Acquired c = l.acquire("k", "conc");
            assertTrue(c.decision().allowed());
            assertTrue(l.release(c.lease()));
            assertFalse(l.release(c.lease()));
            // a check of a concurrency policy is refused: no lease could give its units back
            assertThrows(ShardlimitException.InvalidArgument.class, () -> l.check("k", "conc"));
        }
    }

    @Test
    void layeredChargeRefundReserveSettle() {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            Decision d = l.checkAll(List.of(new Layer("u", "api", 1), new Layer("t", "tb", 11)));
            assertFalse(d.allowed());
            assertEquals(1, d.layer().orElseThrow());
            // nothing was consumed by the denied layered check
            assertEquals(2, l.peek("u", "api").remaining());
            assertTrue(l.charge("c", "tb", 15).allowed());
            assertEquals(0, l.peek("c", "tb").remaining());
            Reserved r = l.reserve("r", "tb", 8);
            assertTrue(r.decision().allowed());
            assertEquals(2, r.decision().remaining());
            Decision s = l.settle(r.reservation(), 3);
            assertEquals(7, s.remaining());
            assertEquals(9, l.refund("r", "tb", 2).remaining());
            l.reset("r", "tb");
            assertEquals(10, l.peek("r", "tb").remaining());
        }
    }

    @Test
    void blockListOverridesShadowAndEvents() throws Exception {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            var events = new java.util.concurrent.LinkedBlockingQueue<Results.Event>();
            l.subscribe(events::add);
            l.block("bad", Duration.ofMinutes(1), "abuse");
            Decision d = l.check("bad", "api");
            assertFalse(d.allowed());
            assertEquals("block", d.source());
            assertEquals("abuse", l.blocked("bad").orElseThrow().reason());
            assertTrue(l.unblock("bad"));
            assertFalse(l.unblock("bad"));
            assertTrue(l.blocked("bad").isEmpty());
            Results.Event e = events.poll(10, java.util.concurrent.TimeUnit.SECONDS);
            assertNotNull(e, "no event");
            assertEquals("blocked", e.kind());
            assertEquals("blocked", e.fields().get("kind"));

            Map<String, Object> o = l.setOverride("vip", "ov", "100/minute", null);
            assertEquals("vip", o.get("key"));
            assertEquals(100, l.check("vip", "ov").limit());
            assertTrue(l.getOverride("vip", "ov").isPresent());
            @SuppressWarnings("unchecked")
            List<Object> listed = (List<Object>) l.listOverrides("ov", null, 100).get("overrides");
            assertEquals(1, listed.size());
            assertTrue(l.deleteOverride("vip", "ov"));
            assertTrue(l.getOverride("vip", "ov").isEmpty());

            l.check("s", "api");
            l.check("s", "api");
            Decision sd = l.checkShadow("s", "api", 1);
            assertTrue(sd.allowed());
            assertTrue(sd.shadowDenied());
            Map<String, Object> rep = l.shadowReport("api", 10);
            assertEquals(1L, rep.get("total"));
        }
    }

    @Test
    void stateMetricsReloadScale() throws Exception {
        try (Limiter l = memory(new ManualClock(1_000_000))) {
            assertTrue(l.policies().contains("api"));
            assertEquals("fixed_window", l.policy("api").get("algorithm"));
            assertEquals("memory", l.config().get("engine"));
            assertTrue(l.route("k").isEmpty());
            assertEquals(0, l.configGeneration());
            l.check("k", "api");
            assertTrue(l.memoryKeys().orElseThrow() >= 1);
            assertTrue(l.metrics().contains("shardlimit_"), l.metrics());
            assertNotNull(l.metricsSnapshot().get("policies"));
            var report = l.reload("{\"policies\":{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":3,\"window\":\"1s\"}}}");
            assertTrue(report.policiesChanged().contains("api"), report.toString());
            assertEquals(1, l.configGeneration());
            l.setScale(0.5);
            assertEquals(0.5, l.scale());
            // the latency hook, as Node's setLatencyScale and Python's set_latency_scale: a
            // Duration, so no unit to get wrong (the double form is seconds, the core's unit)
            assertThrows(ShardlimitException.InvalidArgument.class, () -> l.observeHealth(Duration.ofMillis(1)));
            l.setLatencyScale(Duration.ofMillis(100), 0.2);
            assertEquals(1.0, l.observeHealth(Duration.ofMillis(50)));
            assertEquals(1.0, l.scale());
            assertEquals(0.5, l.observeHealth(Duration.ofMillis(200)), 1e-9);
            assertEquals(0.5, l.scale(), 1e-9);
            assertEquals(0.25, l.observeHealth(0.4), 1e-9); // seconds
            assertEquals(0.2, l.observeHealth(Duration.ofSeconds(5)), 1e-9); // never below minFactor
            assertThrows(ShardlimitException.InvalidArgument.class, () -> l.setLatencyScale(Duration.ofMillis(-1), 0.5));
            assertThrows(ShardlimitException.InvalidArgument.class, () -> l.observeHealth((Duration) null));
            assertThrows(ShardlimitException.Config.class, () -> l.reload("{}x"));
            java.nio.file.Path f = java.nio.file.Files.createTempFile("shardlimit-java", ".json");
            java.nio.file.Files.writeString(f, "{\"policies\":" + POLICIES + "}");
            try (Limiter fromFile = Limiter.fromConfigFile(f)) {
                assertEquals(4, fromFile.policies().size());
                assertTrue(fromFile.reloadFromFile(f).policiesChanged().isEmpty());
            } finally {
                java.nio.file.Files.delete(f);
            }
        }
    }

    @Test
    void clientIpKeyBehindTrustedProxies() {
        assertEquals("203.0.113.7", Limiter.clientIpKey("10.0.0.1:5000", "203.0.113.7, 10.0.0.2",
                List.of("10.0.0.0/8"), 64));
        assertEquals("10.0.0.1", Limiter.clientIpKey("10.0.0.1", "203.0.113.7", List.of(), 64));
    }
}
