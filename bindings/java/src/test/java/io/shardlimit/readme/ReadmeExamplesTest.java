package io.shardlimit.readme;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlimit.Decision;
import io.shardlimit.Lease;
import io.shardlimit.Limiter;
import io.shardlimit.ShardlimitException;
import io.shardlimit.TestRedis;
import io.shardlimit.servlet.RateLimitFilter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/**
 * The examples of bindings/java/README.md, run. Each README code block is the text between a
 * pair of "// README:" markers here (checked by the last test), so the README shows code that
 * runs.
 */
class ReadmeExamplesTest {
    static String config(TestRedis redis) {
        return redis.config("{\"api\":{\"algorithm\":\"sliding_window\",\"limit\":100,\"window\":\"1m\"},"
                + "\"uploads\":{\"algorithm\":\"concurrency\",\"max\":4,\"lease_ttl\":\"30s\"}}", null);
    }

    @Test
    void plain() throws Exception {
        try (TestRedis redis = TestRedis.start()) {
            String json = config(redis);
            // README: plain
            try (Limiter limiter = Limiter.fromJson(json)) {
                Decision d = limiter.check("user:42", "api");          // blocking: the future's join()
                if (!d.allowed()) {
                    System.out.println("retry in " + d.retryAfter().orElseThrow());
                }
                CompletableFuture<Decision> f = limiter.checkAsync("user:42", "api", 5);
                f.thenAccept(x -> System.out.println(x.remaining())); // runs on the limiter's executor

                try (Lease lease = limiter.acquire("user:42", "uploads").lease()) {
                    // ... at most 4 uploads at once per user; close() releases
                }

                try {
                    limiter.check("user:42", "no-such-policy");
                } catch (ShardlimitException.UnknownPolicy e) {
                    System.out.println(e.kind());                       // "unknown_policy"
                } catch (ShardlimitException.Backend e) {
                    // connection, timeout, script, unavailable (with "on_error": "error")
                }
            }
            // README: end
        }
    }

    @Test
    void servlet() {
        try (Limiter limiter = Limiter.memory()) {
            // README: servlet
            RateLimitFilter filter = RateLimitFilter.builder(limiter)
                    .rule("/api/*", "api")                     // 1 unit of "api" per request
                    .rule("/upload", "uploads")                // a lease held for the request
                    .trustedProxies(List.of("10.0.0.0/8"))     // X-Forwarded-For believed from these
                    .build();
            // Tomcat/Jetty: register it for "/*"; Spring Boot: a FilterRegistrationBean
            // README: end
            assertTrue(filter != null);
        }
    }

    @Test
    void theReadmeShowsTheseExamples() throws Exception {
        String readme = Files.readString(Path.of(System.getProperty("shardlimit.root", "../.."),
                "bindings/java/README.md"));
        Path tests = Path.of(System.getProperty("shardlimit.root", "../.."), "bindings/java/src/test/java/io/shardlimit");
        String me = Files.readString(tests.resolve("readme/ReadmeExamplesTest.java"))
                + Files.readString(tests.resolve("spring/SpringBootStarterTest.java"));
        List<String> blocks = new ArrayList<>();
        String marker = "// READ" + "ME: "; // (split: this line is no marker)
        int at = 0;
        while ((at = me.indexOf(marker, at)) >= 0) {
            int start = me.indexOf('\n', at) + 1;
            String name = me.substring(at + 11, start - 1).trim();
            if (name.equals("end")) {
                at = start;
                continue;
            }
            int end = me.indexOf(marker + "end", start);
            String block = me.substring(start, me.lastIndexOf('\n', end) + 1);
            // as indented in the README: the block's own indentation removed
            int indent = block.length() - block.stripLeading().length();
            StringBuilder out = new StringBuilder();
            for (String line : block.split("\n", -1)) {
                out.append(line.length() >= indent ? line.substring(indent) : line.strip()).append('\n');
            }
            blocks.add(out.toString().stripTrailing());
            at = end;
        }
        assertEquals(4, blocks.size());
        for (String b : blocks) {
            assertTrue(readme.contains(b), "README.md does not show:\n" + b);
        }
    }
}
