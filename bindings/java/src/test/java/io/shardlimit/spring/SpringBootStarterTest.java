package io.shardlimit.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.micrometer.core.instrument.MeterRegistry;
import io.shardlimit.Json;
import io.shardlimit.Limiter;
import io.shardlimit.TestRedis;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.boot.web.servlet.context.ServletWebServerApplicationContext;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/** A Spring Boot application on 127.0.0.1 configured by shardlimit.* properties, over HTTP. */
class SpringBootStarterTest {
    static final String POLICIES = "{\"api\":{\"algorithm\":\"fixed_window\",\"limit\":2,\"window\":\"1m\"},"
            + "\"method\":{\"algorithm\":\"fixed_window\",\"limit\":1,\"window\":\"1m\"}}";

    // README: spring
    @SpringBootApplication
    @RestController
    static class App {
        @GetMapping("/api/hello")
        String hello() {
            return "hello";
        }

        @RateLimit(policy = "method", keyHeader = "X-Api-Key")
        @GetMapping("/limited")
        String limited() {
            return "limited";
        }

        @GetMapping("/free")
        String free() {
            return "free";
        }
    }
    // README: end

    final HttpClient http = HttpClient.newHttpClient();

    static ConfigurableApplicationContext start(String configJson) {
        return new SpringApplicationBuilder(App.class).web(WebApplicationType.SERVLET).properties(
                "server.address=127.0.0.1", "server.port=0", "spring.main.banner-mode=off",
                "logging.level.root=WARN",
                "management.endpoints.web.exposure.include=health,metrics",
                "management.endpoint.health.show-details=always",
                // README: properties
                "shardlimit.config-json=" + configJson,            // or shardlimit.config=<file>
                "shardlimit.rules[0].pattern=/api/*", "shardlimit.rules[0].policy=api"
                // README: end
                ).run();
    }

    HttpResponse<String> get(ConfigurableApplicationContext ctx, String path, String... headers) throws Exception {
        int port = ((ServletWebServerApplicationContext) ctx).getWebServer().getPort();
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path));
        for (int k = 0; k + 1 < headers.length; k += 2) {
            b.header(headers[k], headers[k + 1]);
        }
        return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
    }

    @Test
    void answers429FromRedisWithHealthAndMetrics() throws Exception {
        try (TestRedis redis = TestRedis.start();
                ConfigurableApplicationContext ctx = start(redis.config(POLICIES, "\"key_prefix\":\"boot:\""))) {
            Limiter limiter = ctx.getBean(Limiter.class);
            assertTrue(limiter.isRedis());
            assertEquals(200, get(ctx, "/api/hello").statusCode());
            HttpResponse<String> ok = get(ctx, "/api/hello");
            assertEquals(200, ok.statusCode());
            assertEquals("0", ok.headers().firstValue("X-RateLimit-Remaining").orElseThrow());
            HttpResponse<String> denied = get(ctx, "/api/hello");
            assertEquals(429, denied.statusCode());
            assertEquals("rate_limited", Json.object(denied.body()).get("error"));
            assertTrue(denied.headers().firstValue("Retry-After").isPresent());
            // no rule, no annotation: not limited
            for (int i = 0; i < 3; i++) {
                assertEquals(200, get(ctx, "/free").statusCode());
            }
            // @RateLimit(policy = "method", keyHeader = "X-Api-Key"): one per key
            assertEquals(200, get(ctx, "/limited", "X-Api-Key", "a").statusCode());
            assertEquals(429, get(ctx, "/limited", "X-Api-Key", "a").statusCode());
            assertEquals(200, get(ctx, "/limited", "X-Api-Key", "b").statusCode());
            // the decisions came from Redis (on_error: error in this config)
            assertEquals("redis", limiter.peek("x-api-key:a", "method").source());
            HttpResponse<String> health = get(ctx, "/actuator/health");
            assertEquals(200, health.statusCode(), health.body());
            @SuppressWarnings("unchecked")
            Map<String, Object> components = (Map<String, Object>) Json.object(health.body()).get("components");
            @SuppressWarnings("unchecked")
            Map<String, Object> sl = (Map<String, Object>) components.get("shardlimit");
            assertEquals("UP", sl.get("status"));
            MeterRegistry registry = ctx.getBean(MeterRegistry.class);
            assertEquals(2.0, registry.get("shardlimit.decisions").tag("policy", "api").tag("outcome", "allowed")
                    .functionCounter().count());
            assertEquals(1.0, registry.get("shardlimit.decisions").tag("policy", "api").tag("outcome", "denied")
                    .functionCounter().count());
        }
    }

    @Test
    void answers503WhenTheLimitCannotBeChecked() throws Exception {
        int dead;
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"))) {
            dead = s.getLocalPort();
        }
        String cfg = "{\"shards\":[{\"name\":\"s0\",\"url\":\"redis://127.0.0.1:" + dead + "\"}],\"timeout_ms\":300,"
                + "\"on_error\":\"closed\",\"policies\":" + POLICIES + "}";
        try (ConfigurableApplicationContext ctx = start(cfg)) {
            HttpResponse<String> r = get(ctx, "/api/hello");
            assertEquals(503, r.statusCode());
            assertEquals("1", r.headers().firstValue("Retry-After").orElseThrow());
            assertEquals("rate_limit_unavailable", Json.object(r.body()).get("error"));
            HttpResponse<String> health = get(ctx, "/actuator/health");
            assertEquals(503, health.statusCode(), health.body());
        }
    }
}
