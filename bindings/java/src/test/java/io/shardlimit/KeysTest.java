package io.shardlimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletionException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * tests/vectors/keys.json, the one key rule (1..=1024 bytes of UTF-8, no NUL), on both
 * engines. Keys cross into the library as UTF-8 bytes, so the raw bytes of every case
 * (invalid UTF-8 too) are passed where the conversion happens (the native entry points).
 */
class KeysTest {
    static RedisServer redis;

    @BeforeAll
    static void start() throws Exception {
        redis = RedisServer.start();
    }

    @AfterAll
    static void stop() throws Exception {
        redis.close();
    }

    static final String POLICIES = "{\"w\":{\"algorithm\":\"fixed_window\",\"limit\":100,\"window\":\"1m\"},"
            + "\"c\":{\"algorithm\":\"concurrency\",\"max\":100,\"lease_ttl\":\"1m\"}}";

    void replay(Limiter l) throws Exception {
        var doc = Vectors.read("tests/vectors/keys.json");
        List<Map<String, Object>> cases = VectorsTest.list(doc.get("cases"));
        assertTrue(cases.size() > 5);
        byte[] w = "w".getBytes();
        byte[] c = "c".getBytes();
        for (Map<String, Object> k : cases) {
            byte[] key = HexFormat.of().parseHex((String) k.get("hex"));
            boolean accepted = (Boolean) k.get("accepted");
            Map<String, Runnable> calls = Map.of(
                    "check", () -> l.withHandle(h -> Native.check(h, key, w, null, 1, Native.CHECK, l.newCall())),
                    "peek", () -> l.withHandle(h -> Native.check(h, key, w, null, 0, Native.PEEK, l.newCall())),
                    "acquire", () -> l.withHandle(h -> Native.acquire(h, key, c, 1, l.newCall())),
                    "checkAll", () -> l.withHandle(h -> Native.checkAll(h, new byte[][] {key}, new byte[][] {w},
                            new long[] {1}, l.newCall())));
            for (var e : calls.entrySet()) {
                String where = k.get("name") + " (" + e.getKey() + ")";
                Call<?> call = l.lastCall(e.getValue());
                if (accepted) {
                    call.join();
                } else {
                    var err = org.junit.jupiter.api.Assertions.assertThrows(CompletionException.class, call::join, where);
                    assertTrue(err.getCause() instanceof ShardlimitException.InvalidArgument, where + ": " + err.getCause());
                    assertTrue(err.getCause().getMessage().contains("key"), where + ": " + err.getCause().getMessage());
                }
            }
        }
    }

    @Test
    void memory() throws Exception {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            replay(l);
        }
    }

    @Test
    void redis() throws Exception {
        try (Limiter l = Limiter.fromJson(redis.config(POLICIES, null))) {
            replay(l);
        }
    }

    @Test
    void aJavaStringIsSentAsItsUtf8Bytes() {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            String key = "用户:张";
            assertEquals(99, l.check(key, "w").remaining());
            assertEquals(99, l.peek(new String(key.getBytes(java.nio.charset.StandardCharsets.UTF_8),
                    java.nio.charset.StandardCharsets.UTF_8), "w").remaining());
        }
    }
}
