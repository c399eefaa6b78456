package io.shardlimit.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.shardlimit.Decision;
import io.shardlimit.Json;
import io.shardlimit.Limiter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The filter in an embedded Tomcat on 127.0.0.1, over HTTP. */
class RateLimitFilterTest {
    static final String POLICIES = "{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":2,\"window\":\"1m\"},"
            + "\"uploads\":{\"algorithm\":\"concurrency\",\"max\":1,\"lease_ttl\":\"30s\"}}";
    static final CountDownLatch[] GATE = {new CountDownLatch(0)};

    Tomcat tomcat;
    Path base;
    int port;
    final HttpClient http = HttpClient.newHttpClient();

    /** Answers "ok <source of the decision>"; /uploads waits at the gate. */
    static final class App extends HttpServlet {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doGet(HttpServletRequest req, HttpServletResponse res) throws IOException {
            if (req.getRequestURI().startsWith("/uploads")) {
                try {
                    GATE[0].await(20, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            Decision d = (Decision) req.getAttribute(RateLimitFilter.DECISION_ATTRIBUTE);
            res.getWriter().print("ok " + (d == null ? "-" : d.source()));
        }
    }

    void start(RateLimitFilter filter) throws Exception {
        base = Files.createTempDirectory("shardlimit-tomcat-");
        tomcat = new Tomcat();
        tomcat.setBaseDir(base.toString());
        Connector c = new Connector();
        c.setPort(0);
        c.setProperty("address", "127.0.0.1");
        tomcat.setConnector(c);
        Context ctx = tomcat.addContext("", base.toString());
        Tomcat.addServlet(ctx, "app", new App());
        ctx.addServletMappingDecoded("/*", "app");
        FilterDef fd = new FilterDef();
        fd.setFilterName("shardlimit");
        fd.setFilter(filter);
        ctx.addFilterDef(fd);
        FilterMap fm = new FilterMap();
        fm.setFilterName("shardlimit");
        fm.addURLPattern("/*");
        ctx.addFilterMap(fm);
        tomcat.start();
        port = c.getLocalPort();
    }

    @AfterEach
    void stop() throws Exception {
        if (tomcat != null) {
            tomcat.stop();
            tomcat.destroy();
        }
        if (base != null) {
            try (var s = Files.walk(base)) {
                s.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
            }
        }
    }

    HttpResponse<String> get(String path, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path));
        for (int k = 0; k + 1 < headers.length; k += 2) {
            b.header(headers[k], headers[k + 1]);
        }
        return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
    }

    @Test
    void limitsByPathWithHeadersA429AndItsBody() throws Exception {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            start(RateLimitFilter.builder(l).rule("/api/*", "api").build());
            HttpResponse<String> a = get("/api/x");
            assertEquals(200, a.statusCode());
            assertEquals("ok memory", a.body());
            assertEquals("2", a.headers().firstValue("X-RateLimit-Limit").orElseThrow());
            assertEquals("1", a.headers().firstValue("X-RateLimit-Remaining").orElseThrow());
            assertTrue(a.headers().firstValue("RateLimit-Policy").isPresent());
            assertEquals(200, get("/api/y").statusCode());
            HttpResponse<String> d = get("/api");
            assertEquals(429, d.statusCode());
            assertTrue(d.headers().firstValue("Retry-After").isPresent());
            assertEquals("application/json", d.headers().firstValue("Content-Type").orElseThrow());
            Map<String, Object> body = Json.object(d.body());
            assertEquals("rate_limited", body.get("error"));
            assertEquals("api", body.get("policy"));
            assertEquals(2L, body.get("limit"));
            // no rule: not limited, no headers
            HttpResponse<String> free = get("/health");
            assertEquals(200, free.statusCode());
            assertEquals("ok -", free.body());
            assertFalse(free.headers().firstValue("X-RateLimit-Limit").isPresent());
        }
    }

    @Test
    void forwardedForIsBelievedFromTrustedProxiesOnly() throws Exception {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            start(RateLimitFilter.builder(l).rule("/*", "api").trustedProxies(List.of("127.0.0.0/8")).build());
            for (int i = 0; i < 2; i++) {
                assertEquals(200, get("/", "X-Forwarded-For", "203.0.113.1").statusCode());
            }
            assertEquals(429, get("/", "X-Forwarded-For", "203.0.113.1").statusCode());
            // another client behind the same proxy has its own budget
            assertEquals(200, get("/", "X-Forwarded-For", "203.0.113.2").statusCode());
        }
        stop();
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            // no trusted proxy: the header is ignored, the peer (127.0.0.1) is the client
            start(RateLimitFilter.builder(l).rule("/*", "api").build());
            assertEquals(200, get("/", "X-Forwarded-For", "203.0.113.1").statusCode());
            assertEquals(200, get("/", "X-Forwarded-For", "203.0.113.2").statusCode());
            assertEquals(429, get("/", "X-Forwarded-For", "203.0.113.3").statusCode());
        }
    }

    @Test
    void keyedByAHeader() throws Exception {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            start(RateLimitFilter.builder(l).rule("/*", "api").keyHeader("X-Api-Key", List.of()).build());
            assertEquals(200, get("/", "X-Api-Key", "a").statusCode());
            assertEquals(200, get("/", "X-Api-Key", "a").statusCode());
            assertEquals(429, get("/", "X-Api-Key", "a").statusCode());
            assertEquals(200, get("/", "X-Api-Key", "b").statusCode());
            assertTrue(l.peek("x-api-key:b", "api").remaining() == 1);
        }
    }

    @Test
    void aConcurrencyPolicyHoldsALeaseForTheRequest() throws Exception {
        try (Limiter l = Limiter.fromJson("{\"policies\":" + POLICIES + "}")) {
            start(RateLimitFilter.builder(l).rule("/uploads/*", "uploads").build());
            GATE[0] = new CountDownLatch(1);
            CompletableFuture<HttpResponse<String>> first = CompletableFuture.supplyAsync(() -> {
                try {
                    return get("/uploads/a");
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            // the first request holds the one slot while it waits at the gate
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (l.peek("ip:127.0.0.1", "uploads").remaining() != 0) {
                assertTrue(System.nanoTime() < deadline, "the first request never took its lease");
                Thread.sleep(10);
            }
            assertEquals(429, get("/uploads/b").statusCode());
            GATE[0].countDown();
            assertEquals(200, first.get(20, TimeUnit.SECONDS).statusCode());
            // released when its response ended
            deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (l.peek("ip:127.0.0.1", "uploads").remaining() != 1) {
                assertTrue(System.nanoTime() < deadline, "the lease was not released");
                Thread.sleep(10);
            }
            assertEquals(200, get("/uploads/c").statusCode());
        } finally {
            GATE[0] = new CountDownLatch(0);
        }
    }

    @Test
    void anOutageThatDeniesIs503() throws Exception {
        int dead;
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
            dead = s.getLocalPort();
        }
        String cfg = "{\"shards\":[{\"name\":\"s0\",\"url\":\"redis://127.0.0.1:" + dead + "\"}],\"timeout_ms\":300,"
                + "\"on_error\":\"closed\",\"policies\":" + POLICIES + "}";
        try (Limiter l = Limiter.fromJson(cfg)) {
            start(RateLimitFilter.builder(l).rule("/*", "api").build());
            HttpResponse<String> r = get("/");
            assertEquals(503, r.statusCode());
            assertEquals("1", r.headers().firstValue("Retry-After").orElseThrow());
            Map<String, Object> body = Json.object(r.body());
            assertEquals("rate_limit_unavailable", body.get("error"));
            assertEquals("api", body.get("policy"));
        }
    }

    @Test
    void onRedisTheDecisionsComeFromRedis() throws Exception {
        try (var redis = io.shardlimit.TestRedis.start();
                Limiter l = Limiter.fromJson(redis.config(POLICIES, "\"key_prefix\":\"flt:\""))) {
            start(RateLimitFilter.builder(l).rule("/*", "api").build());
            assertEquals("ok redis", get("/").body());
            assertEquals("ok redis", get("/").body());
            HttpResponse<String> d = get("/");
            assertEquals(429, d.statusCode());
            assertEquals("rate_limited", Json.object(d.body()).get("error"));
        }
    }
}
