//! The config's `gateway` section: how Envoy's domains and descriptors map to policies and
//! keys. The core accepts the section and ignores it; it is validated here, against the
//! policies and plans of the same file.
//!
//! ```json
//! "gateway": {
//!   "domains": {
//!     "edge": {
//!       "rules": [
//!         {"name": "per-key", "match": [{"key": "generic_key", "value": "api"}, {"key": "api_key"}],
//!          "policy": "api", "key": "key:{api_key}", "plan_from": "plan"},
//!         {"match": [{"key": "remote_address"}], "policy": "per_ip", "key": "ip:{remote_address}"},
//!         {"match": [{"key": "generic_key", "value": "health"}], "unlimited": true}
//!       ],
//!       "request_limits": false
//!     }
//!   }
//! }
//! ```

use serde_json::{Map, Value};
use shardlimit::{Config, MAX_KEY_LEN};
use std::collections::BTreeMap;

/// Bounds that keep a hostile config or request from costing unbounded work.
pub const MAX_RULES: usize = 1000;
pub const MAX_ENTRIES: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct Gateway {
    pub domains: BTreeMap<String, Domain>,
}

#[derive(Debug, Clone)]
pub struct Domain {
    pub rules: Vec<Rule>,
    /// Honour a descriptor's `limit` (the proxy dictates the limit).
    pub request_limits: bool,
}

#[derive(Debug, Clone)]
pub struct Rule {
    /// For metrics and logs: `name`, else `rule<i>`.
    pub name: String,
    pub entries: Vec<EntryMatch>,
    /// None when unlimited.
    pub policy: Option<String>,
    pub key: Vec<Part>,
    pub plan_from: Option<String>,
    pub shadow: bool,
    pub unlimited: bool,
}

#[derive(Debug, Clone)]
pub struct EntryMatch {
    pub key: String,
    /// None: any value. Otherwise a pattern with at most one `*`.
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Lit(String),
    /// The value of the descriptor entry of this key.
    Entry(String),
    Domain,
}

fn err(field: &str, msg: impl std::fmt::Display) -> String {
    format!("gateway.{field}: {msg}")
}

fn check_fields(obj: &Map<String, Value>, field: &str, allowed: &[&str]) -> Result<(), String> {
    for k in obj.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(err(
                field,
                format!(
                    "unknown field \"{k}\" (expected one of: {})",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// `*` anywhere, at most once: `foo*`, `*bar`, `a*z`, `*`.
pub fn glob_match(pattern: &str, value: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == value,
        Some((pre, post)) => {
            value.len() >= pre.len() + post.len() && value.starts_with(pre) && value.ends_with(post)
        }
    }
}

fn parse_key(field: &str, text: &str, entries: &[EntryMatch]) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Lit(rest[..open].to_string()));
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| err(field, format!("unclosed '{{' in \"{text}\"")))?;
        let name = &after[..close];
        if name == "domain" {
            parts.push(Part::Domain);
        } else if entries.iter().any(|e| e.key == name) {
            parts.push(Part::Entry(name.to_string()));
        } else {
            return Err(err(
                field,
                format!(
                    "\"{{{name}}}\" names no entry of the rule's match (entries: {})",
                    entries
                        .iter()
                        .map(|e| e.key.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        if rest.contains('}') {
            return Err(err(field, format!("unmatched '}}' in \"{text}\"")));
        }
        parts.push(Part::Lit(rest.to_string()));
    }
    if parts.is_empty() {
        return Err(err(field, "must not be empty"));
    }
    Ok(parts)
}

impl Gateway {
    /// Parses the whole config file's JSON: its `gateway` section (none = no domains),
    /// checked against `config`'s policies and plans.
    pub fn from_config_json(root: &Value, config: &Config) -> Result<Gateway, String> {
        match root.get("gateway") {
            None | Some(Value::Null) => Ok(Gateway::default()),
            Some(v) => Gateway::from_value(v, config),
        }
    }

    pub fn from_value(v: &Value, config: &Config) -> Result<Gateway, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| "gateway: expected an object".to_string())?;
        check_fields(obj, "gateway", &["domains", "description"])
            .map_err(|e| e.replacen("gateway.gateway", "gateway", 1))?;
        let mut gw = Gateway::default();
        let Some(domains) = obj.get("domains") else {
            return Ok(gw);
        };
        let domains = domains
            .as_object()
            .ok_or_else(|| err("domains", "expected an object of domain name -> domain"))?;
        let mut total = 0usize;
        for (name, d) in domains {
            let field = format!("domains.{name}");
            if name.is_empty() {
                return Err(err(&field, "a domain name must not be empty"));
            }
            let d = d
                .as_object()
                .ok_or_else(|| err(&field, "expected an object with \"rules\""))?;
            check_fields(d, &field, &["rules", "request_limits", "description"])?;
            let request_limits = match d.get("request_limits") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(err(
                        &format!("{field}.request_limits"),
                        format!("expected true or false, got {v}"),
                    ))
                }
            };
            let rules_v = d
                .get("rules")
                .and_then(Value::as_array)
                .ok_or_else(|| err(&format!("{field}.rules"), "expected an array of rules"))?;
            total += rules_v.len();
            if total > MAX_RULES {
                return Err(err("domains", format!("at most {MAX_RULES} rules in all")));
            }
            let mut rules = Vec::with_capacity(rules_v.len());
            for (i, r) in rules_v.iter().enumerate() {
                rules.push(parse_rule(&format!("{field}.rules[{i}]"), i, r, config)?);
            }
            gw.domains.insert(
                name.clone(),
                Domain {
                    rules,
                    request_limits,
                },
            );
        }
        Ok(gw)
    }
}

fn parse_rule(field: &str, i: usize, v: &Value, config: &Config) -> Result<Rule, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| err(field, "expected an object"))?;
    check_fields(
        obj,
        field,
        &[
            "name",
            "match",
            "policy",
            "key",
            "plan_from",
            "shadow",
            "unlimited",
            "description",
        ],
    )?;
    let name = match obj.get("name") {
        None => format!("rule{i}"),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 => s.clone(),
        Some(v) => {
            return Err(err(
                &format!("{field}.name"),
                format!("expected a string of 1 to 128 characters, got {v}"),
            ))
        }
    };
    let m = obj.get("match").and_then(Value::as_array).ok_or_else(|| {
        err(
            &format!("{field}.match"),
            "expected an array of {\"key\", \"value\"} entries",
        )
    })?;
    if m.is_empty() || m.len() > MAX_ENTRIES {
        return Err(err(
            &format!("{field}.match"),
            format!("expected 1 to {MAX_ENTRIES} entries"),
        ));
    }
    let mut entries = Vec::with_capacity(m.len());
    for (j, e) in m.iter().enumerate() {
        let f = format!("{field}.match[{j}]");
        let e = e
            .as_object()
            .ok_or_else(|| err(&f, "expected {\"key\": ..., \"value\": ...}"))?;
        check_fields(e, &f, &["key", "value"])?;
        let key = e
            .get("key")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| err(&format!("{f}.key"), "expected a non-empty string"))?
            .to_string();
        if entries.iter().any(|x: &EntryMatch| x.key == key) {
            return Err(err(
                &format!("{f}.key"),
                format!("\"{key}\" appears twice in one rule"),
            ));
        }
        let value = match e.get("value") {
            None => None,
            Some(Value::String(s)) if s == "*" => None,
            Some(Value::String(s)) => {
                if s.matches('*').count() > 1 {
                    return Err(err(&format!("{f}.value"), "at most one '*' wildcard"));
                }
                Some(s.clone())
            }
            Some(v) => {
                return Err(err(
                    &format!("{f}.value"),
                    format!("expected a string, got {v}"),
                ))
            }
        };
        entries.push(EntryMatch { key, value });
    }
    let flag = |k: &str| -> Result<bool, String> {
        match obj.get(k) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(err(
                &format!("{field}.{k}"),
                format!("expected true or false, got {v}"),
            )),
        }
    };
    let unlimited = flag("unlimited")?;
    let shadow = flag("shadow")?;
    let policy = match obj.get("policy") {
        None if unlimited => None,
        None => {
            return Err(err(
                &format!("{field}.policy"),
                "required (or \"unlimited\": true)",
            ))
        }
        Some(Value::String(p)) => {
            if unlimited {
                return Err(err(field, "\"unlimited\" rules take no policy"));
            }
            if !config.policies.contains_key(p) {
                return Err(err(
                    &format!("{field}.policy"),
                    format!(
                        "unknown policy \"{p}\" (the config's policies: {})",
                        config
                            .policies
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            if config.policies[p].algorithm() == shardlimit::Algorithm::Concurrency {
                return Err(err(
                    &format!("{field}.policy"),
                    format!("\"{p}\" is a concurrency policy: a gateway check holds no lease to release"),
                ));
            }
            Some(p.clone())
        }
        Some(v) => {
            return Err(err(
                &format!("{field}.policy"),
                format!("expected a string, got {v}"),
            ))
        }
    };
    let key = match obj.get("key") {
        // the values of every entry, joined: one counter per distinct descriptor
        None => {
            let mut parts = Vec::new();
            for (j, e) in entries.iter().enumerate() {
                if j > 0 {
                    parts.push(Part::Lit(":".into()));
                }
                parts.push(Part::Entry(e.key.clone()));
            }
            parts
        }
        Some(Value::String(s)) => parse_key(&format!("{field}.key"), s, &entries)?,
        Some(v) => {
            return Err(err(
                &format!("{field}.key"),
                format!("expected a string, got {v}"),
            ))
        }
    };
    let plan_from = match obj.get("plan_from") {
        None => None,
        Some(Value::String(s)) if entries.iter().any(|e| &e.key == s) => {
            if policy.is_none() {
                return Err(err(
                    &format!("{field}.plan_from"),
                    "an unlimited rule has no plan",
                ));
            }
            Some(s.clone())
        }
        Some(v) => {
            return Err(err(
                &format!("{field}.plan_from"),
                format!("expected the key of one of the rule's match entries, got {v}"),
            ))
        }
    };
    Ok(Rule {
        name,
        entries,
        policy,
        key,
        plan_from,
        shadow,
        unlimited,
    })
}

impl Domain {
    /// The first rule whose entries match the descriptor's, in order and count.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<&Rule> {
        self.find_index(entries).map(|i| &self.rules[i])
    }

    /// The index of [`Domain::find`]'s rule.
    pub fn find_index(&self, entries: &[(&str, &str)]) -> Option<usize> {
        self.rules.iter().position(|r| {
            r.entries.len() == entries.len()
                && r.entries.iter().zip(entries).all(|(m, (k, v))| {
                    m.key == *k && m.value.as_deref().is_none_or(|p| glob_match(p, v))
                })
        })
    }
}

impl Rule {
    /// The rate-limit key for a matching descriptor; an error names what is wrong (a key
    /// too long or empty).
    pub fn key_for(&self, domain: &str, entries: &[(&str, &str)]) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.key {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Domain => out.push_str(domain),
                Part::Entry(k) => {
                    if let Some((_, v)) = entries.iter().find(|(ek, _)| ek == k) {
                        out.push_str(v)
                    }
                }
            }
            if out.len() > MAX_KEY_LEN {
                return Err(format!(
                    "rule {}: the key is longer than {MAX_KEY_LEN} bytes",
                    self.name
                ));
            }
        }
        if out.is_empty() {
            return Err(format!("rule {}: the key is empty", self.name));
        }
        Ok(out)
    }

    pub fn plan<'a>(&self, entries: &[(&'a str, &'a str)]) -> Option<&'a str> {
        let k = self.plan_from.as_deref()?;
        entries.iter().find(|(ek, _)| *ek == k).map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> Config {
        Config::from_value(&json!({"policies": {"api": "10/minute", "ip": "5/second"}})).unwrap()
    }

    #[test]
    fn globs() {
        assert!(glob_match("foo*", "foobar"));
        assert!(glob_match("*bar", "foobar"));
        assert!(glob_match("f*r", "foobar"));
        assert!(!glob_match("f*x", "foobar"));
        assert!(!glob_match("ab*ba", "aba"));
        assert!(glob_match("exact", "exact"));
    }

    #[test]
    fn rules_match_and_build_keys() {
        let gw = Gateway::from_value(
            &json!({"domains": {"edge": {"rules": [
                {"match": [{"key": "generic_key", "value": "api"}, {"key": "api_key"}], "policy": "api", "key": "key:{api_key}"},
                {"match": [{"key": "remote_address", "value": "10.*"}], "policy": "ip"},
                {"match": [{"key": "generic_key", "value": "health"}], "unlimited": true}
            ]}}}),
            &cfg(),
        )
        .unwrap();
        let d = &gw.domains["edge"];
        let e = [("generic_key", "api"), ("api_key", "k1")];
        let r = d.find(&e).unwrap();
        assert_eq!(r.key_for("edge", &e).unwrap(), "key:k1");
        let e = [("remote_address", "10.1.2.3")];
        assert_eq!(d.find(&e).unwrap().key_for("edge", &e).unwrap(), "10.1.2.3");
        assert!(d.find(&[("remote_address", "11.1.2.3")]).is_none());
        assert!(d.find(&[("generic_key", "health")]).unwrap().unlimited);
        // order and count must match
        assert!(d
            .find(&[("api_key", "k1"), ("generic_key", "api")])
            .is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let bad = |v: Value| Gateway::from_value(&v, &cfg()).unwrap_err();
        assert!(bad(
            json!({"domains": {"e": {"rules": [{"match": [{"key": "a"}], "policy": "nope"}]}}})
        )
        .contains("gateway.domains.e.rules[0].policy: unknown policy \"nope\""));
        assert!(bad(json!({"domains": {"e": {"rules": [{"match": [{"key": "a"}], "policy": "api", "key": "{b}"}]}}})).contains("names no entry"));
        assert!(
            bad(json!({"domains": {"e": {"rules": [{"match": [], "policy": "api"}]}}}))
                .contains("match")
        );
        assert!(bad(json!({"domains": {"e": {"rules": [{"match": [{"key": "a"}], "policy": "api", "bogus": 1}]}}})).contains("unknown field \"bogus\""));
        assert!(bad(json!({"domains": {"e": {"rules": [{"match": [{"key": "a", "value": "*x*"}], "policy": "api"}]}}})).contains("at most one"));
        let conc = Config::from_value(
            &json!({"policies": {"c": {"algorithm": "concurrency", "max": 1, "lease_ttl": "1s"}}}),
        )
        .unwrap();
        let e = Gateway::from_value(
            &json!({"domains": {"e": {"rules": [{"match": [{"key": "a"}], "policy": "c"}]}}}),
            &conc,
        )
        .unwrap_err();
        assert!(e.contains("concurrency"), "{e}");
    }

    #[test]
    fn long_keys_are_refused() {
        let gw = Gateway::from_value(
            &json!({"domains": {"e": {"rules": [{"match": [{"key": "a"}], "policy": "api"}]}}}),
            &cfg(),
        )
        .unwrap();
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let e = [("a", long.as_str())];
        assert!(gw.domains["e"]
            .find(&e)
            .unwrap()
            .key_for("e", &e)
            .unwrap_err()
            .contains("longer"));
    }
}
