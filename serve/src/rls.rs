//! Envoy's `ShouldRateLimit`, decided with the core: descriptors mapped to (policy, key) by
//! the gateway section, the consuming ones checked as one layered check.

use crate::gateway::{Domain, Rule, MAX_ENTRIES};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::rls::rate_limit_response::{rate_limit, Code, DescriptorStatus, RateLimit};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::State;
use shardlimit::{Decision, Error, ErrorKind, Layer, Limit, Policy};
use std::time::Duration;
use tonic::Status;

/// At most this many descriptors in one request (the core's layered-check bound).
pub const MAX_DESCRIPTORS: usize = 64;

/// What one descriptor asks.
enum Ask {
    /// No rule matched: not limited.
    NoRule,
    Unlimited(usize),
    /// Layer `layer` of the layered check (several descriptors may share one).
    Check {
        rule: usize,
        layer: usize,
    },
    Peek {
        rule: usize,
        key: String,
        policy: Policy,
    },
    Refund {
        rule: usize,
        key: String,
        policy: Policy,
        cost: u64,
    },
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg.into())
}

/// The deadline Envoy gave this call: the smaller of `grpc-timeout` and
/// `x-envoy-expected-rq-timeout-ms`.
pub fn deadline_of(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let grpc = md
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout);
    let envoy = md
        .get("x-envoy-expected-rq-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    match (grpc, envoy) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `grpc-timeout`: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (n, unit) = v.split_at(v.len() - 1);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The (limit, window) a limit's headers would describe.
fn limit_window(l: &Limit) -> (u64, Duration) {
    match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => (*limit, *window),
        Limit::TokenBucket {
            capacity,
            refill_per_sec: r,
        }
        | Limit::LeakyBucket {
            capacity,
            leak_per_sec: r,
        } => (
            *capacity,
            Duration::from_secs_f64((*capacity as f64 / r.max(1e-9)).min(1e9)),
        ),
        Limit::Concurrency { max, lease_ttl } => (*max, *lease_ttl),
        #[allow(unreachable_patterns)]
        _ => (0, Duration::ZERO),
    }
}

/// `current_limit` for a limit over an arbitrary window: the largest of second, minute,
/// hour, day not longer than the window, and the limit scaled to it (rounded up). Exact
/// when the window is one unit. Envoy only logs it or renders it in headers we tell users
/// to leave off (shardlimit renders exact headers itself).
pub fn rate_limit_of(name: &str, limit: u64, window: Duration) -> RateLimit {
    let units = [
        (rate_limit::Unit::Day, 86_400u64),
        (rate_limit::Unit::Hour, 3_600),
        (rate_limit::Unit::Minute, 60),
        (rate_limit::Unit::Second, 1),
    ];
    let w = window.as_secs_f64().max(1e-6);
    let (unit, secs) = units
        .iter()
        .copied()
        .find(|(_, s)| (*s as f64) <= w)
        .unwrap_or((rate_limit::Unit::Second, 1));
    let per = ((limit as f64) * (secs as f64) / w).ceil();
    RateLimit {
        name: name.to_string(),
        requests_per_unit: per.min(u32::MAX as f64) as u32,
        unit: unit as i32,
    }
}

fn status_of(d: &Decision, name: &str) -> DescriptorStatus {
    let code = if d.allowed { Code::Ok } else { Code::OverLimit };
    let measured = d.measured();
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(rate_limit_of(name, d.limit, d.window)),
        limit_remaining: if measured {
            d.remaining.min(u32::MAX as u64) as u32
        } else {
            0
        },
        duration_until_reset: measured.then(|| prost_types::Duration {
            seconds: d.reset_after.as_secs() as i64,
            nanos: d.reset_after.subsec_nanos() as i32,
        }),
        quota: None,
    }
}

fn unit_duration(unit: i32) -> Option<Duration> {
    use crate::proto::envoy::r#type::v3::RateLimitUnit as U;
    Some(Duration::from_secs(match U::try_from(unit).ok()? {
        U::Second => 1,
        U::Minute => 60,
        U::Hour => 3_600,
        U::Day => 86_400,
        U::Month => 30 * 86_400,
        U::Year => 365 * 86_400,
        _ => return None,
    }))
}

/// The policy of a matched descriptor: the rule's, in the plan a descriptor entry names
/// (an unknown plan: the rule's own policy), the request's `limit` when the domain allows
/// it, in shadow when the rule says so.
fn policy_for(
    state: &State,
    domain: &Domain,
    rule: &Rule,
    desc: &RateLimitDescriptor,
    entries: &[(&str, &str)],
) -> Result<Policy, Status> {
    let name = rule.policy.as_deref().unwrap_or_default();
    let base = state
        .limiter
        .policy(name)
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
    let mut p = match rule.plan(entries) {
        Some(plan) => state
            .limiter
            .plan_policy(plan, name)
            .unwrap_or(base.clone()),
        None => base.clone(),
    };
    if domain.request_limits {
        if let Some(o) = &desc.limit {
            if o.requests_per_unit > 0 {
                let w = unit_duration(o.unit)
                    .ok_or_else(|| invalid(format!("descriptor limit: unknown unit {}", o.unit)))?;
                let limit = Limit::fixed_window(o.requests_per_unit as u64, w);
                p = Policy::new(&format!("{name}@{}", limit.id()), limit)
                    .map_err(|e| invalid(e.to_string()))?
                    .with_on_error(base.on_error());
            }
        }
    }
    if rule.shadow {
        p = p.with_shadow(true).map_err(|e| invalid(e.to_string()))?;
    }
    Ok(p)
}

/// A core error as a gRPC status: bad input is INVALID_ARGUMENT, a backend failure under
/// `on_error: error` is UNAVAILABLE (Envoy's `failure_mode_deny` then decides).
pub fn status_of_error(e: &Error) -> Status {
    match e.kind() {
        ErrorKind::InvalidArgument | ErrorKind::UnknownPolicy => invalid(e.to_string()),
        ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Script | ErrorKind::Unavailable => {
            Status::unavailable(e.to_string())
        }
        _ => Status::internal(e.to_string()),
    }
}

pub async fn should_rate_limit(
    state: &State,
    req: RateLimitRequest,
    deadline: Option<Duration>,
) -> Result<RateLimitResponse, Status> {
    if req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(format!(
            "at most {MAX_DESCRIPTORS} descriptors, got {}",
            req.descriptors.len()
        )));
    }
    let gw = state.gateway.load();
    let domain_name = req.domain.as_str();
    let Some(domain) = gw.domains.get(domain_name) else {
        state.metrics.rule("unknown", "", "no_rule");
        // like Lyft's: a domain without rules limits nothing
        return Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: req
                .descriptors
                .iter()
                .map(|_| DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    };
    let request_cost = u64::from(req.hits_addend.max(1));
    let mut asks = Vec::with_capacity(req.descriptors.len());
    let mut layers: Vec<Layer> = Vec::new();
    let mut layer_rule: Vec<usize> = Vec::new();
    for (i, desc) in req.descriptors.iter().enumerate() {
        if desc.entries.len() > MAX_ENTRIES {
            asks.push(Ask::NoRule);
            continue;
        }
        let entries: Vec<(&str, &str)> = desc
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let Some(ri) = domain.find_index(&entries) else {
            asks.push(Ask::NoRule);
            continue;
        };
        let rule = &domain.rules[ri];
        if rule.unlimited {
            asks.push(Ask::Unlimited(ri));
            continue;
        }
        let key = rule
            .key_for(domain_name, &entries)
            .map_err(|e| invalid(format!("descriptors[{i}]: {e}")))?;
        let policy = policy_for(state, domain, rule, desc, &entries)?;
        let cost = desc.hits_addend.unwrap_or(request_cost);
        if desc.is_negative_hits {
            if cost > 0 {
                asks.push(Ask::Refund {
                    rule: ri,
                    key,
                    policy,
                    cost,
                });
            } else {
                asks.push(Ask::Peek {
                    rule: ri,
                    key,
                    policy,
                });
            }
        } else if cost == 0 {
            asks.push(Ask::Peek {
                rule: ri,
                key,
                policy,
            });
        } else if let Some(j) = layers
            .iter()
            .position(|l| l.key == key && l.policy.name() == policy.name())
        {
            // one budget, asked twice: one layer of the summed cost
            layers[j].cost = layers[j].cost.saturating_add(cost);
            asks.push(Ask::Check { rule: ri, layer: j });
        } else {
            layers.push(Layer::new(key, &policy, cost));
            layer_rule.push(ri);
            asks.push(Ask::Check {
                rule: ri,
                layer: layers.len() - 1,
            });
        }
    }

    // what the core is asked, within the gRPC deadline
    let peeks: Vec<(usize, String, Policy)> = asks
        .iter()
        .enumerate()
        .filter_map(|(i, a)| match a {
            Ask::Peek { key, policy, .. } => Some((i, key.clone(), policy.clone())),
            _ => None,
        })
        .collect();
    let work = async {
        let checked = match layers.as_slice() {
            [] => None,
            // one layer: the single check (the same decision, and its script does less
            // than the layered one: no second read of the state)
            [l] => Some(state.limiter.check(&l.key, &l.policy, l.cost).await),
            _ => Some(state.limiter.check_all(&layers).await),
        };
        let mut peeked = Vec::with_capacity(peeks.len());
        for (i, key, policy) in &peeks {
            peeked.push((*i, state.limiter.peek(key, policy).await));
        }
        let mut refunded = Vec::new();
        for (i, a) in asks.iter().enumerate() {
            if let Ask::Refund {
                key, policy, cost, ..
            } = a
            {
                refunded.push((i, state.limiter.refund(key, policy, *cost).await));
            }
        }
        (checked, peeked, refunded)
    };
    let (checked, peeked, refunded) = match deadline {
        Some(d) => {
            let budget = d
                .saturating_sub(state.deadline_margin)
                .max(Duration::from_millis(1));
            match tokio::time::timeout(budget, work).await {
                Ok(r) => r,
                Err(_) => {
                    // the call's own deadline passed: the policies' on_error modes decide
                    let e = Error::Timeout {
                        shard: "gateway".into(),
                        timeout_ms: budget.as_millis() as u64,
                    };
                    let mut all = layers.clone();
                    for (_, key, policy) in &peeks {
                        all.push(Layer::new(key.clone(), policy, 0));
                    }
                    let d = state
                        .limiter
                        .fallback_decision(&all, e)
                        .map_err(|e| status_of_error(&e))?;
                    for r in &layer_rule {
                        state
                            .metrics
                            .rule(domain_name, &domain.rules[*r].name, "fallback");
                    }
                    tracing::debug!(
                        domain = domain_name,
                        allowed = d.allowed,
                        "deadline passed: on_error decided"
                    );
                    let mut resp = response_for(&d, None);
                    let code = if d.allowed { Code::Ok } else { Code::OverLimit } as i32;
                    resp.statuses = asks
                        .iter()
                        .map(|a| {
                            // not measured: the code and the limit, nothing left or reset
                            let (rule, limit) = match a {
                                Ask::Check { rule, layer } => {
                                    (*rule, Some(layers[*layer].policy.limit()))
                                }
                                Ask::Peek { rule, policy, .. }
                                | Ask::Refund { rule, policy, .. } => (*rule, Some(policy.limit())),
                                Ask::Unlimited(_) | Ask::NoRule => {
                                    return DescriptorStatus {
                                        code: Code::Ok as i32,
                                        ..Default::default()
                                    }
                                }
                            };
                            DescriptorStatus {
                                code,
                                current_limit: limit.map(|l| {
                                    let (l, w) = limit_window(l);
                                    rate_limit_of(&domain.rules[rule].name, l, w)
                                }),
                                ..Default::default()
                            }
                        })
                        .collect();
                    return Ok(resp);
                }
            }
        }
        None => work.await,
    };

    let checked = checked.transpose().map_err(|e| status_of_error(&e))?;
    let mut peek_d = Vec::with_capacity(peeked.len());
    for (i, r) in peeked {
        peek_d.push((i, r.map_err(|e| status_of_error(&e))?));
    }
    let mut refund_d = Vec::with_capacity(refunded.len());
    for (i, r) in refunded {
        refund_d.push((i, r.map_err(|e| status_of_error(&e))?));
    }

    // the decision the headers describe: a denial (the layered check's first), else the
    // one with the fewest units left
    let mut headline: Option<&Decision> = None;
    for d in checked.iter().chain(peek_d.iter().map(|(_, d)| d)) {
        headline = Some(match headline {
            None => d,
            Some(h) if h.allowed && !d.allowed => d,
            Some(h) if h.allowed == d.allowed && d.remaining < h.remaining => d,
            Some(h) => h,
        });
    }
    let deciding_layer = checked.as_ref().map(|d| d.layer.unwrap_or(0));
    let mut statuses = Vec::with_capacity(asks.len());
    for (i, a) in asks.iter().enumerate() {
        let s = match a {
            Ask::NoRule => {
                state.metrics.rule(domain_name, "", "no_rule");
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                }
            }
            Ask::Unlimited(r) => {
                state
                    .metrics
                    .rule(domain_name, &domain.rules[*r].name, "unlimited");
                DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                }
            }
            Ask::Check { rule, layer } => {
                let rname = &domain.rules[*rule].name;
                let d = checked.as_ref().expect("layers were checked");
                if let Some(own) = d
                    .layers
                    .get(*layer)
                    .filter(|_| d.layers.len() == layers.len())
                {
                    // the layer's own state: its code, limit, what it has left (a denied
                    // check consumed nothing) and when it resets
                    if d.allowed || !own.allowed {
                        note(state, domain_name, rname, own);
                    } else {
                        state.metrics.rule(domain_name, rname, "over_limit_other");
                    }
                    status_of(own, rname)
                } else if Some(*layer) == deciding_layer {
                    note(state, domain_name, rname, d);
                    status_of(d, rname)
                } else {
                    // not the deciding layer, and the check was not decided layer by layer
                    // (a block, a fallback): its code is OK (it did not decide) and its
                    // limit is the policy's
                    state.metrics.rule(
                        domain_name,
                        rname,
                        if d.allowed {
                            "within_limit"
                        } else {
                            "over_limit_other"
                        },
                    );
                    let (l, w) = limit_window(layers[*layer].policy.limit());
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        current_limit: Some(rate_limit_of(rname, l, w)),
                        ..Default::default()
                    }
                }
            }
            Ask::Peek { rule, .. } => {
                let rname = &domain.rules[*rule].name;
                let d = &peek_d.iter().find(|(j, _)| *j == i).expect("peeked").1;
                note(state, domain_name, rname, d);
                status_of(d, rname)
            }
            Ask::Refund { rule, .. } => {
                let rname = &domain.rules[*rule].name;
                let d = &refund_d.iter().find(|(j, _)| *j == i).expect("refunded").1;
                state.metrics.rule(domain_name, rname, "refund");
                status_of(d, rname)
            }
        };
        statuses.push(s);
    }
    let mut resp = match headline {
        Some(d) => response_for(d, None),
        None => RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        },
    };
    resp.statuses = statuses;
    Ok(resp)
}

fn note(state: &State, domain: &str, rule: &str, d: &Decision) {
    let outcome = if d.source == shardlimit::Source::Fallback {
        "fallback"
    } else if d.shadow_denied {
        "shadow_mode"
    } else if d.allowed {
        "within_limit"
    } else {
        "over_limit"
    };
    state.metrics.rule(domain, rule, outcome);
}

/// The overall code, the decision's headers and, when denied, its JSON body.
fn response_for(d: &Decision, _name: Option<&str>) -> RateLimitResponse {
    let mut headers: Vec<HeaderValue> = d
        .headers()
        .into_iter()
        .map(|(k, v)| HeaderValue {
            key: k.to_string(),
            value: v,
            ..Default::default()
        })
        .collect();
    let mut raw_body = Vec::new();
    if !d.allowed {
        headers.push(HeaderValue {
            key: "content-type".into(),
            value: "application/json".into(),
            ..Default::default()
        });
        raw_body = d.body().to_string().into_bytes();
    }
    RateLimitResponse {
        overall_code: if d.allowed { Code::Ok } else { Code::OverLimit } as i32,
        response_headers_to_add: headers,
        raw_body,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("5000u"), Some(Duration::from_millis(5)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789m"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
    }

    #[test]
    fn current_limit_units() {
        let r = rate_limit_of("a", 100, Duration::from_secs(60));
        assert_eq!(
            (r.requests_per_unit, r.unit),
            (100, rate_limit::Unit::Minute as i32)
        );
        let r = rate_limit_of("a", 5, Duration::from_secs(10));
        assert_eq!(
            (r.requests_per_unit, r.unit),
            (1, rate_limit::Unit::Second as i32)
        );
        let r = rate_limit_of("a", 30, Duration::from_secs(300));
        assert_eq!(
            (r.requests_per_unit, r.unit),
            (6, rate_limit::Unit::Minute as i32)
        );
    }
}
