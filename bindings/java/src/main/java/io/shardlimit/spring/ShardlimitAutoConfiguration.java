package io.shardlimit.spring;

import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.binder.MeterBinder;
import io.shardlimit.Decision;
import io.shardlimit.Limiter;
import io.shardlimit.servlet.RateLimitFilter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import org.springframework.boot.actuate.health.Health;
import org.springframework.boot.actuate.health.HealthIndicator;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.web.servlet.FilterRegistrationBean;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.Ordered;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.HandlerInterceptor;
import org.springframework.web.servlet.config.annotation.InterceptorRegistry;
import org.springframework.web.servlet.config.annotation.WebMvcConfigurer;

/**
 * Spring Boot auto-configuration: a {@link Limiter} bean (from {@code shardlimit.config},
 * {@code shardlimit.config-json} or SHARDLIMIT_CONFIG; closed with the context), the
 * {@link RateLimitFilter} for {@code shardlimit.rules}, {@link RateLimit} on MVC handlers, an
 * Actuator health indicator ({@code shardlimit}) and Micrometer counters
 * ({@code shardlimit.decisions}, tagged by policy and outcome).
 */
@AutoConfiguration
@ConditionalOnClass(Limiter.class)
@EnableConfigurationProperties(ShardlimitProperties.class)
public class ShardlimitAutoConfiguration {

    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    public Limiter shardlimitLimiter(ShardlimitProperties p) {
        if (p.getConfigJson() != null && !p.getConfigJson().isBlank()) {
            return Limiter.fromJson(p.getConfigJson());
        }
        if (p.getConfig() != null && !p.getConfig().isBlank()) {
            return Limiter.fromConfigFile(Path.of(p.getConfig()));
        }
        return Limiter.fromEnv();
    }

    static Function<HttpServletRequest, String> key(String header, List<String> trustedProxies) {
        Function<HttpServletRequest, String> byAddress = RateLimitFilter.clientAddress(trustedProxies);
        if (header == null || header.isEmpty()) {
            return byAddress;
        }
        return req -> {
            String v = req.getHeader(header);
            return v == null || v.isEmpty() ? byAddress.apply(req) : header.toLowerCase() + ":" + v;
        };
    }

    /** The Servlet filter and the {@link RateLimit} interceptor. */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
    @ConditionalOnClass({FilterRegistrationBean.class, WebMvcConfigurer.class})
    static class Web {
        @Bean
        @ConditionalOnMissingBean(name = "shardlimitFilter")
        FilterRegistrationBean<RateLimitFilter> shardlimitFilter(Limiter limiter, ShardlimitProperties p) {
            RateLimitFilter.Builder b = RateLimitFilter.builder(limiter)
                    .key(key(p.getKeyHeader(), p.getTrustedProxies()))
                    .outageRetryAfter(p.getOutageRetryAfter());
            for (ShardlimitProperties.Rule r : p.getRules()) {
                b.rule(r.getPattern(), r.getPolicy(), r.getCost());
            }
            FilterRegistrationBean<RateLimitFilter> reg = new FilterRegistrationBean<>(b.build());
            reg.addUrlPatterns("/*");
            reg.setOrder(Ordered.HIGHEST_PRECEDENCE + 10);
            reg.setEnabled(!p.getRules().isEmpty());
            return reg;
        }

        @Bean
        WebMvcConfigurer shardlimitRateLimitAnnotation(Limiter limiter, ShardlimitProperties p) {
            HandlerInterceptor interceptor = new HandlerInterceptor() {
                @Override
                public boolean preHandle(HttpServletRequest req, HttpServletResponse res, Object handler)
                        throws Exception {
                    if (!(handler instanceof HandlerMethod m)) {
                        return true;
                    }
                    RateLimit rl = m.getMethodAnnotation(RateLimit.class);
                    if (rl == null) {
                        rl = m.getBeanType().getAnnotation(RateLimit.class);
                    }
                    if (rl == null) {
                        return true;
                    }
                    String k = key(rl.keyHeader(), p.getTrustedProxies()).apply(req);
                    Decision d = limiter.check(k, rl.policy(), rl.cost());
                    req.setAttribute(RateLimitFilter.DECISION_ATTRIBUTE, d);
                    if (!d.allowed()) {
                        RateLimitFilter.deny(res, d, p.getOutageRetryAfter());
                        return false;
                    }
                    for (Map.Entry<String, String> h : d.headers().entrySet()) {
                        res.setHeader(h.getKey(), h.getValue());
                    }
                    return true;
                }
            };
            return new WebMvcConfigurer() {
                @Override
                public void addInterceptors(InterceptorRegistry registry) {
                    registry.addInterceptor(interceptor);
                }
            };
        }
    }

    /** Actuator: {@code /actuator/health} reports whether every shard answers. */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(HealthIndicator.class)
    static class Actuator {
        @Bean
        @ConditionalOnMissingBean(name = "shardlimitHealthIndicator")
        HealthIndicator shardlimitHealthIndicator(Limiter limiter) {
            return () -> {
                if (!limiter.isRedis()) {
                    return Health.up().withDetail("engine", "memory").build();
                }
                try {
                    limiter.connect(Duration.ofSeconds(1));
                    return Health.up().withDetail("engine", "redis")
                            .withDetail("shards", limiter.config().get("shards")).build();
                } catch (RuntimeException e) {
                    return Health.down().withDetail("engine", "redis").withDetail("error", e.getMessage()).build();
                }
            };
        }
    }

    /** Micrometer: the core's counters per policy, as {@code shardlimit.decisions{policy,outcome}}. */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(MeterBinder.class)
    static class Metrics {
        static final List<String> OUTCOMES = List.of("allowed", "denied", "fallback", "blocked", "local_admitted",
                "redis_errors", "shadow_denied", "near_limit");

        @Bean
        MeterBinder shardlimitMeters(Limiter limiter) {
            return (MeterRegistry registry) -> {
                for (String policy : limiter.policies()) {
                    for (String outcome : OUTCOMES) {
                        FunctionCounter.builder("shardlimit.decisions", limiter, l -> count(l, policy, outcome))
                                .tag("policy", policy).tag("outcome", outcome)
                                .description("decisions of shardlimit by policy and outcome").register(registry);
                    }
                }
            };
        }

        @SuppressWarnings("unchecked")
        static double count(Limiter l, String policy, String outcome) {
            try {
                for (Map<String, Object> p : (List<Map<String, Object>>) l.metricsSnapshot().get("policies")) {
                    if (policy.equals(p.get("policy"))) {
                        return ((Number) p.get(outcome)).doubleValue();
                    }
                }
            } catch (RuntimeException closed) {
                // a closed limiter counts nothing more
            }
            return 0;
        }
    }
}
