package io.shardlimit.spring;

import java.util.ArrayList;
import java.util.List;
import org.springframework.boot.context.properties.ConfigurationProperties;

/**
 * {@code shardlimit.*} in application.yml:
 * <pre>
 * shardlimit:
 *   config: /etc/shardlimit.json      # or config-json: '{"policies": ...}'; neither: SHARDLIMIT_CONFIG
 *   trusted-proxies: [10.0.0.0/8]
 *   rules:
 *     - pattern: /api/*
 *       policy: api
 * </pre>
 */
@ConfigurationProperties("shardlimit")
public class ShardlimitProperties {
    /** A JSON configuration file. */
    private String config;
    /** A JSON configuration, inline. */
    private String configJson;
    /** Proxies (CIDRs) whose X-Forwarded-For is believed. */
    private List<String> trustedProxies = new ArrayList<>();
    /** A request header to key the filter's requests by (empty: the client address). */
    private String keyHeader = "";
    /** Retry-After seconds of a 503. */
    private int outageRetryAfter = 1;
    /** The Servlet filter's rules, by path. */
    private List<Rule> rules = new ArrayList<>();

    /** One rule of the filter. */
    public static class Rule {
        private String pattern;
        private String policy;
        private long cost = 1;

        public String getPattern() { return pattern; }
        public void setPattern(String pattern) { this.pattern = pattern; }
        public String getPolicy() { return policy; }
        public void setPolicy(String policy) { this.policy = policy; }
        public long getCost() { return cost; }
        public void setCost(long cost) { this.cost = cost; }
    }

    public String getConfig() { return config; }
    public void setConfig(String config) { this.config = config; }
    public String getConfigJson() { return configJson; }
    public void setConfigJson(String configJson) { this.configJson = configJson; }
    public List<String> getTrustedProxies() { return trustedProxies; }
    public void setTrustedProxies(List<String> trustedProxies) { this.trustedProxies = trustedProxies; }
    public String getKeyHeader() { return keyHeader; }
    public void setKeyHeader(String keyHeader) { this.keyHeader = keyHeader; }
    public int getOutageRetryAfter() { return outageRetryAfter; }
    public void setOutageRetryAfter(int outageRetryAfter) { this.outageRetryAfter = outageRetryAfter; }
    public List<Rule> getRules() { return rules; }
    public void setRules(List<Rule> rules) { this.rules = rules; }
}
