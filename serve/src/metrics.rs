//! The service's own counters, in the Prometheus text format after the limiter's. Every
//! label value comes from a bounded set: the endpoints, the status codes this service
//! answers, and the domains and rules of the config (a request's unknown domain counts as
//! "unknown").

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Default)]
pub struct ServeMetrics {
    /// (endpoint, status) -> count
    http: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// (domain, rule, outcome) -> count; outcome: within_limit, over_limit, shadow_mode,
    /// unlimited, no_rule, fallback
    rules: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    /// gRPC status code name -> count
    grpc: Mutex<BTreeMap<&'static str, u64>>,
    /// requests refused because --max-concurrency were in flight
    pub overloaded: std::sync::atomic::AtomicU64,
}

impl ServeMetrics {
    pub fn http(&self, endpoint: &'static str, status: u16) {
        if let Ok(mut m) = self.http.lock() {
            *m.entry((endpoint, status)).or_default() += 1;
        }
    }

    pub fn rule(&self, domain: &str, rule: &str, outcome: &'static str) {
        if let Ok(mut m) = self.rules.lock() {
            // avoid allocating on the hot path when the series exists
            if let Some(v) = m
                .iter_mut()
                .find(|((d, r, o), _)| d == domain && r == rule && *o == outcome)
                .map(|(_, v)| v)
            {
                *v += 1;
            } else {
                m.insert((domain.to_string(), rule.to_string(), outcome), 1);
            }
        }
    }

    pub fn grpc(&self, code: &'static str) {
        if let Ok(mut m) = self.grpc.lock() {
            *m.entry(code).or_default() += 1;
        }
    }

    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        s.push_str("# HELP shardlimit_serve_http_requests_total HTTP requests by endpoint and status.\n# TYPE shardlimit_serve_http_requests_total counter\n");
        if let Ok(m) = self.http.lock() {
            for ((e, st), n) in m.iter() {
                let _ = writeln!(
                    s,
                    "shardlimit_serve_http_requests_total{{endpoint=\"{e}\",status=\"{st}\"}} {n}"
                );
            }
        }
        s.push_str("# HELP shardlimit_serve_rls_requests_total ShouldRateLimit calls by gRPC status and overall code.\n# TYPE shardlimit_serve_rls_requests_total counter\n");
        if let Ok(m) = self.grpc.lock() {
            for (c, n) in m.iter() {
                let _ = writeln!(s, "shardlimit_serve_rls_requests_total{{code=\"{c}\"}} {n}");
            }
        }
        s.push_str("# HELP shardlimit_serve_rule_descriptors_total Descriptors by gateway domain, rule and outcome (within_limit, over_limit, shadow_mode, unlimited, fallback, no_rule).\n# TYPE shardlimit_serve_rule_descriptors_total counter\n");
        if let Ok(m) = self.rules.lock() {
            for ((d, r, o), n) in m.iter() {
                let _ = writeln!(
                    s,
                    "shardlimit_serve_rule_descriptors_total{{domain=\"{}\",rule=\"{}\",outcome=\"{o}\"}} {n}",
                    escape(d),
                    escape(r)
                );
            }
        }
        let _ = writeln!(
            s,
            "# HELP shardlimit_serve_overloaded_total Requests refused because --max-concurrency were in flight.\n# TYPE shardlimit_serve_overloaded_total counter\nshardlimit_serve_overloaded_total {}",
            self.overloaded.load(std::sync::atomic::Ordering::Relaxed)
        );
        s
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
