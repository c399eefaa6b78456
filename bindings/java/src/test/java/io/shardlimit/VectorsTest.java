package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlimit.Results.Acquired;
import io.shardlimit.Results.Layer;
import io.shardlimit.Results.Reservation;
import io.shardlimit.Results.Reserved;
import java.io.IOException;
import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.BiFunction;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The decision vectors of tests/vectors replayed as core/tests/vectors.rs does: every case on
 * a fresh limiter with a ManualClock set to each step's t_us, every op of every file, on the
 * in-memory engine and on a real redis-server (with on_error: error, and every decision's
 * source checked: none may come from a fallback). Decisions must equal the vectors to the µs.
 */
class VectorsTest {
    static final List<String> FILES = List.of("algorithms.json", "plans.json", "precision.json", "settle.json",
            "shadow.json", "overrides.json");
    /** The other files of tests/vectors, and the test that replays each. */
    static final Map<String, String> OTHER_FILES = Map.of("keys.json", "KeysTest", "routing.json",
            "VectorsTest.routing");
    static final Set<String> OPS = Set.of("check", "peek", "acquire", "release", "reset", "check_all", "batch",
            "charge", "refund", "reserve", "settle", "shadow_report", "set_override", "delete_override");

    static RedisServer redis;

    @BeforeAll
    static void start() throws Exception {
        redis = RedisServer.start();
    }

    @AfterAll
    static void stop() throws Exception {
        redis.close();
    }

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> list(Object o) {
        return (List<Map<String, Object>>) o;
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> obj(Object o) {
        return (Map<String, Object>) o;
    }

    static List<Map<String, Object>> cases() throws IOException {
        List<Map<String, Object>> all = new ArrayList<>();
        for (String f : FILES) {
            for (Map<String, Object> c : list(Vectors.read("tests/vectors/" + f).get("cases"))) {
                Map<String, Object> m = new LinkedHashMap<>(c);
                m.put("file", f);
                all.add(m);
            }
        }
        return all;
    }

    static Map<String, Object> observed(Decision d) {
        Map<String, Object> m = new HashMap<>();
        m.put("allowed", d.allowed());
        m.put("limit", d.limit());
        m.put("remaining", d.remaining());
        m.put("reset_after_us", d.resetAfterMicros());
        m.put("retry_after_us", d.retryAfterMicros() < 0 ? null : d.retryAfterMicros());
        m.put("delay_us", d.delayMicros());
        m.put("policy", d.policy());
        m.put("layer", d.layer().isPresent() ? (Object) (long) d.layer().getAsInt() : null);
        if (d.limitIndex().isPresent()) {
            m.put("limit_index", (long) d.limitIndex().getAsInt());
            m.put("rate_limit_policy", d.headers().get("RateLimit-Policy"));
        }
        if (d.shadowDenied()) {
            m.put("shadow_denied", true);
        }
        return m;
    }

    static long num(Object o) {
        return ((Number) o).longValue();
    }

    static long cost(Map<String, Object> s, String field) {
        return s.get(field) == null ? 1 : num(s.get(field));
    }

    /** A check, peek or acquire (alone or in a batch). */
    static Acquired call(Limiter l, Map<String, Object> item) {
        String key = (String) item.get("key");
        String policy = (String) item.get("policy");
        String plan = (String) item.get("plan");
        switch ((String) item.get("op")) {
            case "check": {
                long cost = cost(item, "cost");
                Decision d;
                if (Boolean.TRUE.equals(item.get("shadow"))) {
                    assertNull(plan, "a shadow check under a plan");
                    d = l.checkShadow(key, policy, cost);
                } else {
                    d = plan == null ? l.check(key, policy, cost) : l.checkPlan(key, plan, policy, cost);
                }
                return new Acquired(d, null);
            }
            case "peek":
                return new Acquired(plan == null ? l.peek(key, policy) : l.peekPlan(key, plan, policy), null);
            case "acquire":
                return l.acquire(key, policy, cost(item, "units"));
            default:
                throw new AssertionError("op " + item.get("op") + " cannot be a check or a batch item");
        }
    }

    static int replay(BiFunction<Map<String, Object>, ManualClock, Limiter> limiterFor, String source) {
        int steps = 0;
        List<Map<String, Object>> cases;
        try {
            cases = cases();
        } catch (IOException e) {
            throw new AssertionError(e);
        }
        for (Map<String, Object> c : cases) {
            ManualClock clock = new ManualClock(0);
            try (Limiter l = limiterFor.apply(c, clock)) {
                Map<String, Lease> leases = new HashMap<>();
                Map<String, Reservation> reservations = new HashMap<>();
                int i = 0;
                for (Map<String, Object> step : list(c.get("steps"))) {
                    clock.setMicros(num(step.get("t_us")));
                    String where = c.get("file") + ": " + c.get("name") + ", step " + i + ": " + Json.write(step);
                    String op = (String) step.get("op");
                    assertTrue(OPS.contains(op), where + ": unknown op");
                    switch (op) {
                        case "batch": {
                            int j = 0;
                            for (Map<String, Object> item : list(step.get("items"))) {
                                decided(item, call(l, item), source, leases, where + ", item " + j++);
                            }
                            break;
                        }
                        case "release":
                            assertTrue(leases.containsKey(step.get("lease")), where + ": no such lease");
                            assertEquals(step.get("expect_released"), l.release(leases.get(step.get("lease"))), where);
                            break;
                        case "reset":
                            l.reset((String) step.get("key"), (String) step.get("policy"));
                            break;
                        case "charge":
                        case "refund": {
                            assertNull(step.get("plan"), where + ": under a plan");
                            String k = (String) step.get("key");
                            String p = (String) step.get("policy");
                            Decision d = op.equals("charge") ? l.charge(k, p, num(step.get("cost")))
                                    : l.refund(k, p, num(step.get("cost")));
                            decided(step, new Acquired(d, null), source, leases, where);
                            break;
                        }
                        case "reserve": {
                            Reserved r = l.reserve((String) step.get("key"), (String) step.get("policy"),
                                    num(step.get("cost")));
                            decided(step, new Acquired(r.decision(), null), source, leases, where);
                            if (step.get("reserve_as") != null) {
                                assertNotNull(r.reservation(), where + ": no reservation");
                                reservations.put((String) step.get("reserve_as"), r.reservation());
                            }
                            break;
                        }
                        case "settle": {
                            Reservation r = reservations.get(step.get("reservation"));
                            assertNotNull(r, where + ": no such reservation");
                            decided(step, new Acquired(l.settle(r, num(step.get("actual"))), null), source, leases,
                                    where);
                            break;
                        }
                        case "shadow_report": {
                            Integer top = step.get("top") == null ? null : (int) num(step.get("top"));
                            assertEquals(step.get("expect_report"), l.shadowReport((String) step.get("policy"), top),
                                    where);
                            break;
                        }
                        case "set_override": {
                            Duration ttl = step.get("ttl_ms") == null ? null : Duration.ofMillis(num(step.get("ttl_ms")));
                            l.setOverride((String) step.get("key"), (String) step.get("policy"),
                                    (String) step.get("limit"), ttl);
                            break;
                        }
                        case "delete_override":
                            assertEquals(step.get("expect_deleted"),
                                    l.deleteOverride((String) step.get("key"), (String) step.get("policy")), where);
                            break;
                        case "check_all": {
                            List<Layer> layers = list(step.get("layers")).stream()
                                    .map(x -> new Layer((String) x.get("key"), (String) x.get("policy"), cost(x, "cost")))
                                    .collect(Collectors.toList());
                            decided(step, new Acquired(l.checkAll(layers), null), source, leases, where);
                            break;
                        }
                        default:
                            decided(step, call(l, step), source, leases, where);
                    }
                    i++;
                    steps++;
                }
            }
        }
        return steps;
    }

    static void decided(Map<String, Object> item, Acquired a, String source, Map<String, Lease> leases, String where) {
        assertEquals(source, a.decision().source(), where);
        Map<String, Object> want = new HashMap<>(obj(item.get("expect")));
        // whole numbers compare as longs
        want.replaceAll((k, v) -> v instanceof Integer n ? (Object) n.longValue() : v);
        assertEquals(want, observed(a.decision()), where);
        if (item.get("lease_as") != null) {
            assertNotNull(a.lease(), where + ": no lease");
            leases.put((String) item.get("lease_as"), a.lease());
        }
    }

    static String caseConfig(Map<String, Object> c) {
        Map<String, Object> cfg = new LinkedHashMap<>();
        cfg.put("policies", c.get("policies"));
        if (c.get("plans") != null) {
            cfg.put("plans", c.get("plans"));
        }
        if (c.get("default_algorithm") != null) {
            cfg.put("default_algorithm", c.get("default_algorithm"));
        }
        return Json.write(cfg);
    }

    static int totalSteps() throws IOException {
        return cases().stream().mapToInt(c -> list(c.get("steps")).size()).sum();
    }

    @Test
    void theVectorsHoldEveryOp() throws IOException {
        Set<String> ops = new TreeSet<>();
        for (Map<String, Object> c : cases()) {
            for (Map<String, Object> s : list(c.get("steps"))) {
                ops.add((String) s.get("op"));
            }
        }
        assertEquals(new TreeSet<>(OPS), ops);
        assertTrue(totalSteps() > 100);
    }

    @Test
    void everyVectorFileIsReplayed() throws IOException {
        Set<String> present;
        try (var s = Files.list(Vectors.root().resolve("tests/vectors"))) {
            present = s.map(p -> p.getFileName().toString()).filter(n -> n.endsWith(".json"))
                    .collect(Collectors.toCollection(TreeSet::new));
        }
        Set<String> known = new TreeSet<>(FILES);
        known.addAll(OTHER_FILES.keySet());
        assertEquals(known, present, "a vector file neither replayed by Java nor listed");
    }

    @Test
    void theInMemoryEngineMatchesTheVectors() throws IOException {
        int n = replay((c, clock) -> Limiter.fromJson(caseConfig(c), clock), "memory");
        assertEquals(totalSteps(), n);
    }

    @Test
    void theRedisEngineMatchesTheVectors() throws IOException {
        int[] k = {0};
        int n = replay((c, clock) -> {
            // a fresh key space per case
            String cfg = caseConfig(c);
            String json = "{\"shards\":[{\"name\":\"s0\",\"url\":\"" + redis.url() + "\"}],\"on_error\":\"error\","
                    + "\"timeout_ms\":5000,\"key_prefix\":\"jv" + (k[0]++) + ":\"," + cfg.substring(1);
            Limiter l = Limiter.fromJson(json, clock);
            assertTrue(l.isRedis());
            return l;
        }, "redis");
        assertEquals(totalSteps(), n);
    }

    @Test
    void routing() throws IOException {
        List<Map<String, Object>> cases = list(Vectors.read("tests/vectors/routing.json").get("cases"));
        assertTrue(cases.size() > 0);
        for (int n = 1; n <= 16; n++) {
            StringBuilder shards = new StringBuilder();
            for (int s = 0; s < n; s++) {
                shards.append(s == 0 ? "" : ",").append("{\"name\":\"s").append(s).append("\",\"url\":\"")
                        .append(redis.url()).append("\"}");
            }
            try (Limiter l = Limiter.fromJson("{\"shards\":[" + shards + "],\"policies\":{}}")) {
                for (Map<String, Object> c : cases) {
                    @SuppressWarnings("unchecked")
                    long want = num(((List<Object>) c.get("shard_for")).get(n - 1));
                    var r = l.route((String) c.get("key")).orElseThrow();
                    assertEquals(want, r.index(), c.get("key") + " among " + n);
                    assertEquals("s" + want, r.name());
                }
            }
        }
    }
}
