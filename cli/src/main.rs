//! `shardlimit`: validate a config, route keys, check limits and benchmark, from a shell.

use clap::{Args, Parser, Subcommand};
use shardlimit::{Config, Decision, Limiter, Policy, Source};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "shardlimit",
    version,
    about = "Distributed rate limiting: validate configs, route keys, check limits, benchmark."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print `key<TAB>shard index<TAB>shard name` for each key.
    Route {
        #[command(flatten)]
        target: Target,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Check one key and print the decision as JSON. Exit code 0 allowed, 1 denied, 2 error.
    Check {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        /// Units this request costs.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        key: String,
        /// Shadow mode for this check: a would-be denial is allowed (exit 0), consumes
        /// nothing and is reported (`"shadow_denied": true`, and counted for shadow-report).
        #[arg(long)]
        shadow: bool,
    },
    /// Shadow-mode denials of a policy by key, summed over every shard, as JSON:
    /// {"policy", "total", "untracked", "keys": [{"key", "count"}]}, most first.
    ShadowReport {
        #[command(flatten)]
        target: Target,
        /// The policy's name.
        #[arg(long)]
        policy: String,
        /// List at most this many keys (the total counts every key).
        #[arg(long)]
        top: Option<usize>,
    },
    /// Show a key's state without consuming (same JSON as check).
    Peek {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        key: String,
    },
    /// Forget a key's state under a policy.
    Reset {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        key: String,
    },
    /// Consume units without ever denying (the key may go into debt: later checks are
    /// denied until it is repaid). Prints the decision JSON (always allowed; remaining 0
    /// in debt). Exit code 0, 2 on error.
    Charge {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        /// Units to charge.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        key: String,
    },
    /// Give units back, never above the limit. Prints the decision JSON; exit code 0, 2 on
    /// error.
    Refund {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        /// Units to give back.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        key: String,
    },
    /// Layered check: allowed only if every layer allows; a denial consumes nothing.
    /// Prints the decision JSON (with the deciding layer's index); exit codes as check.
    CheckAll {
        #[command(flatten)]
        target: Target,
        /// A layer as KEY=POLICY or KEY=POLICY:COST (repeatable, in order).
        #[arg(long = "layer", required = true)]
        layers: Vec<String>,
    },
    /// Put a key on the block list (every instance of every language sees it).
    Block {
        #[command(flatten)]
        target: Target,
        /// How long, e.g. 15m (default: until unblocked).
        #[arg(long)]
        ttl: Option<String>,
        #[arg(long, default_value = "blocked from the shardlimit CLI")]
        reason: String,
        key: String,
    },
    /// Remove a key from the block list.
    Unblock {
        #[command(flatten)]
        target: Target,
        key: String,
    },
    /// Show a key's block-list entry; exit 0 when blocked, 1 when not.
    Blocked {
        #[command(flatten)]
        target: Target,
        key: String,
    },
    /// Live per-key overrides of a policy (`"overrides": true`): every instance of every
    /// language decides the key's next check with it. JSON output.
    Override {
        #[command(subcommand)]
        command: OverrideCommand,
    },
    /// The client address behind trusted proxies (X-Forwarded-For walked from the right).
    ClientIp {
        /// The TCP peer address, e.g. 10.0.0.5:43122.
        #[arg(long)]
        peer: String,
        /// The X-Forwarded-For header value.
        #[arg(long)]
        xff: Option<String>,
        /// A trusted proxy network (repeatable), e.g. 10.0.0.0/8.
        #[arg(long = "trusted")]
        trusted: Vec<String>,
        /// Print the rate-limit key part instead of the address: IPv6 clients aggregated
        /// to their network of --ipv6-prefix bits, IPv4 (also IPv4-mapped) as itself.
        #[arg(long)]
        key: bool,
        /// The IPv6 prefix length of --key (1 to 128).
        #[arg(long, default_value_t = shardlimit::DEFAULT_IPV6_PREFIX, requires = "key")]
        ipv6_prefix: u8,
    },
    /// Print an assembled Redis script (as loaded by EVALSHA) and its SHA1 on stderr.
    Script {
        /// fixed_window, sliding_window, sliding_log, token_bucket, leaky_bucket,
        /// concurrency, layered, refund, reset, or an algorithm's settle script (fixed_window_settle, ...).
        name: String,
    },
    /// Run the service: Envoy's rate limit service (gRPC) and the HTTP check/auth API for
    /// nginx, Traefik, HAProxy and sidecar callers. Runs the `shardlimit-serve` binary
    /// found beside this one (else on PATH) with the same arguments; `shardlimit serve
    /// --help` shows them. Guide: docs/serve.md.
    #[command(disable_help_flag = true)]
    Serve {
        /// The arguments of shardlimit-serve (--config, --http, --grpc, ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure decisions per second and latency.
    Bench {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        policy: PolicyArg,
        /// Checks in flight at once.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Total checks.
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
        /// Distinct keys, used round-robin.
        #[arg(long, default_value_t = 1_000)]
        keys: u64,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Also print the limiter's metrics in the Prometheus text format.
        #[arg(long)]
        metrics: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config file; prints a summary, or the first error naming its field.
    Validate { file: String },
    /// What changing OLD to NEW would do: policies added/removed/changed, and which
    /// fraction of a sample of keys would move to another shard.
    Diff {
        old: String,
        new: String,
        /// How many generated keys (`key:0`, `key:1`, ...) to route.
        #[arg(long, default_value_t = 100_000)]
        sample: u64,
    },
}

#[derive(Args)]
struct Target {
    /// Config file (default: $SHARDLIMIT_CONFIG; with neither, the in-memory engine).
    #[arg(long)]
    config: Option<String>,
}

#[derive(Subcommand)]
enum OverrideCommand {
    /// Set KEY's override: LIMIT is a rate string ("100/minute", or several limits as
    /// "10/second; 1000/day", in the policy's algorithm), a limit object or an array of
    /// them in JSON as in a config policy, or the name of a plan of the config ("pro").
    Set {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        policy: String,
        /// How long, e.g. 30d (default: until deleted).
        #[arg(long)]
        ttl: Option<String>,
        key: String,
        limit: String,
    },
    /// Print KEY's override; exit 0 when it has one, 1 when not.
    Get {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        policy: String,
        key: String,
    },
    /// Print every override of the policy on every shard, one JSON object a line.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        policy: String,
        /// Overrides asked for per round of calls (memory stays bounded by it).
        #[arg(long, default_value_t = 1000)]
        page: usize,
    },
    /// Delete KEY's override; exit 0 when it had one, 1 when not.
    Delete {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        policy: String,
        key: String,
    },
}

#[derive(Args)]
struct PolicyArg {
    /// A policy name from the config.
    #[arg(long, conflicts_with = "limit")]
    policy: Option<String>,
    /// An ad-hoc limit: a rate string ('10/second; 1000/day', fixed windows) or a policy
    /// as JSON, e.g. '{"algorithm":"token_bucket","capacity":10,"refill_per_sec":1}' or
    /// '{"algorithm":"sliding_window","rate":"100/minute"}' or '{"limits":[...]}'.
    #[arg(long)]
    limit: Option<String>,
    /// Check the --policy as this plan of the config has it.
    #[arg(long, requires = "policy")]
    plan: Option<String>,
}

/// What `config validate` adds about a policy's window placement and exact interval.
fn precision(p: &Policy) -> String {
    let mut s = String::new();
    if p.window_offset() == shardlimit::WindowOffset::PerKey {
        s.push_str(", window_offset per_key");
    }
    if let Some((n, d)) = p.emission_interval_us() {
        if d == 1 {
            s.push_str(&format!(", exactly {n} µs per unit"));
        } else {
            s.push_str(&format!(", exactly {n}/{d} µs per unit"));
        }
    }
    s
}

fn override_command(c: OverrideCommand) -> shardlimit::Result<ExitCode> {
    use serde_json::json;
    let found = |yes: bool| {
        if yes {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    };
    match c {
        OverrideCommand::Set {
            target,
            policy,
            ttl,
            key,
            limit,
        } => {
            let l = limiter(&target)?;
            let ttl = match ttl {
                Some(t) => Some(Duration::from_micros(shardlimit::parse_duration_us(
                    "--ttl", &t,
                )?)),
                None => None,
            };
            let info = l.set_override_blocking(&key, &policy, &limit, ttl)?;
            println!("{}", info.to_json());
            Ok(ExitCode::SUCCESS)
        }
        OverrideCommand::Get {
            target,
            policy,
            key,
        } => {
            let l = limiter(&target)?;
            let info = l.get_override_blocking(&key, &policy)?;
            match &info {
                Some(i) => println!("{}", i.to_json()),
                None => println!(
                    "{}",
                    json!({"key": key, "policy": policy, "limit": null, "remaining_ms": null})
                ),
            }
            Ok(found(info.is_some()))
        }
        OverrideCommand::List {
            target,
            policy,
            page,
        } => {
            let l = limiter(&target)?;
            let mut cursor: Option<String> = None;
            loop {
                let p = l.list_overrides_blocking(&policy, cursor.as_deref(), page)?;
                for o in &p.overrides {
                    println!("{}", o.to_json());
                }
                match p.cursor {
                    Some(c) => cursor = Some(c),
                    None => return Ok(ExitCode::SUCCESS),
                }
            }
        }
        OverrideCommand::Delete {
            target,
            policy,
            key,
        } => {
            let l = limiter(&target)?;
            let deleted = l.delete_override_blocking(&key, &policy)?;
            println!(
                "{}",
                json!({"key": key, "policy": policy, "deleted": deleted})
            );
            Ok(found(deleted))
        }
    }
}

fn limiter(t: &Target) -> shardlimit::Result<Limiter> {
    let l = match &t.config {
        Some(path) => Limiter::from_config_file(path),
        None => Limiter::from_env(),
    }?;
    // the core's rate-limited warnings (fallbacks, circuits opened) on stderr: stdout
    // stays the command's JSON or text
    l.set_log_sink(Some(std::sync::Arc::new(|r: &shardlimit::LogRecord| {
        eprintln!("{}: {}", r.level.name(), r.message)
    })));
    Ok(l)
}

fn policy(l: &Limiter, p: &PolicyArg) -> shardlimit::Result<Policy> {
    match (&p.policy, &p.limit) {
        (Some(name), _) => match &p.plan {
            Some(plan) => l.plan_policy(plan, name),
            None => l.policy(name),
        },
        (None, Some(text)) if !text.trim_start().starts_with('{') => {
            // a rate string: a policy spec of the config too
            let v = serde_json::Value::String(text.clone());
            adhoc(&v)
        }
        (None, Some(json)) => {
            // strict like a config file: a repeated key is an error, never last-wins
            let v = shardlimit::config::parse_strict_json(json).map_err(|e| match e {
                shardlimit::Error::Config { field, message } => shardlimit::Error::Config {
                    field: if field == "config" {
                        "--limit".into()
                    } else {
                        format!("--limit.{field}")
                    },
                    message,
                },
                other => other,
            })?;
            adhoc(&v)
        }
        (None, None) => {
            let cfg = l.config();
            let names: Vec<&String> = cfg.policies.keys().collect();
            Err(missing_policy(&names))
        }
    }
}

/// The ad-hoc policy of `--limit`: read as a config's policy spec (errors name `--limit`),
/// named after its limits.
fn adhoc(v: &serde_json::Value) -> shardlimit::Result<Policy> {
    let cfg = Config::from_value(&serde_json::json!({ "policies": { "adhoc": v } })).map_err(
        |e| match e {
            shardlimit::Error::Config { field, message } => shardlimit::Error::Config {
                field: field.replacen("policies.adhoc", "--limit", 1),
                message,
            },
            other => other,
        },
    )?;
    let p = &cfg.policies["adhoc"];
    Policy::from_limits(p.limits())?.with_window_offset(p.window_offset())
}

/// A policy's limits for a summary: `fixed_window limit=10 window=1000ms; ...`.
fn limits_text(p: &Policy) -> String {
    p.limits()
        .iter()
        .map(|l| l.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

fn missing_policy(names: &[&String]) -> shardlimit::Error {
    let hint = if names.is_empty() {
        "no config with policies is loaded; pass --config FILE or --limit JSON".to_string()
    } else {
        format!(
            "the config has: {}",
            names
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    shardlimit::Error::InvalidArgument {
        what: "--policy".into(),
        message: format!("no policy given: use --policy NAME or --limit JSON; {hint}"),
    }
}

fn decision_json(d: &Decision, l: &Limiter, key: &str) -> serde_json::Value {
    let mut v = d.to_json();
    v["shard"] = match l.route(key) {
        Some((i, name)) => serde_json::json!({ "index": i, "name": name }),
        None => serde_json::Value::Null,
    };
    v
}

/// `d` in the largest whole unit that shows it exactly (`1h`, `90s`, `1500ms`, `7us`).
fn human(d: Duration) -> String {
    let us = d.as_micros();
    for (unit, n) in [
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
    ] {
        if us >= n && us.is_multiple_of(n) {
            return format!("{}{unit}", us / n);
        }
    }
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

/// `shardlimit serve ARGS`: replaces this process with `shardlimit-serve ARGS` (its own
/// crate, so that this command stays small), from beside this binary or on PATH.
fn serve(args: &[String]) -> shardlimit::Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("shardlimit-serve")))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| "shardlimit-serve".into());
    let err = std::process::Command::new(&program).args(args).exec();
    Err(shardlimit::Error::Io {
        path: program.display().to_string(),
        message: format!(
            "cannot run it ({err}): install shardlimit-serve beside shardlimit or on PATH (make dist puts both in dist/bin)"
        ),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("shardlimit: error [{}]: {e}", e.kind());
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> shardlimit::Result<ExitCode> {
    match cli.command {
        Command::Config {
            command: ConfigCommand::Validate { file },
        } => config_validate(file),
        Command::Config {
            command: ConfigCommand::Diff { old, new, sample },
        } => config_diff(old, new, sample),
        Command::Route { target, keys } => {
            let l = limiter(&target)?;
            for k in keys {
                match l.route(&k) {
                    Some((i, name)) => println!("{k}\t{i}\t{name}"),
                    None => println!("{k}\t0\tmemory"),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Check {
            target,
            policy: p,
            cost,
            key,
            shadow,
        } => {
            let l = limiter(&target)?;
            let p = policy(&l, &p)?;
            let d = if shadow {
                l.check_shadow_blocking(&key, &p, cost)?
            } else {
                l.check_blocking(&key, &p, cost)?
            };
            println!("{}", decision_json(&d, &l, &key));
            Ok(if d.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::ShadowReport {
            target,
            policy,
            top,
        } => {
            let l = limiter(&target)?;
            let r = l.shadow_report_blocking(&policy, top)?;
            println!("{}", r.to_json());
            Ok(ExitCode::SUCCESS)
        }
        Command::Peek {
            target,
            policy: p,
            key,
        } => {
            let l = limiter(&target)?;
            let p = policy(&l, &p)?;
            let d = l.peek_blocking(&key, &p)?;
            println!("{}", decision_json(&d, &l, &key));
            Ok(if d.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Reset {
            target,
            policy: p,
            key,
        } => {
            let l = limiter(&target)?;
            let p = policy(&l, &p)?;
            l.reset_blocking(&key, &p)?;
            println!("reset {key} under {}", p.name());
            Ok(ExitCode::SUCCESS)
        }
        Command::Charge {
            target,
            policy: p,
            cost,
            key,
        } => {
            let l = limiter(&target)?;
            let p = policy(&l, &p)?;
            let d = l.charge_blocking(&key, &p, cost)?;
            println!("{}", decision_json(&d, &l, &key));
            Ok(ExitCode::SUCCESS)
        }
        Command::Refund {
            target,
            policy: p,
            cost,
            key,
        } => {
            let l = limiter(&target)?;
            let p = policy(&l, &p)?;
            let d = l.refund_blocking(&key, &p, cost)?;
            println!("{}", decision_json(&d, &l, &key));
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckAll { target, layers } => check_all(target, layers),
        Command::Block {
            target,
            ttl,
            reason,
            key,
        } => {
            let l = limiter(&target)?;
            let ttl = match ttl {
                Some(t) => Some(Duration::from_micros(shardlimit::parse_duration_us(
                    "--ttl", &t,
                )?)),
                None => None,
            };
            l.block_blocking(&key, ttl, &reason)?;
            match ttl {
                Some(t) => println!("blocked {key} for {} ms: {reason}", t.as_millis()),
                None => println!("blocked {key} until unblocked: {reason}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Unblock { target, key } => {
            let l = limiter(&target)?;
            let was = l.unblock_blocking(&key)?;
            println!(
                "{key}: {}",
                if was { "unblocked" } else { "was not blocked" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Override { command } => override_command(command),
        Command::Blocked { target, key } => blocked(target, key),
        Command::Serve { args } => serve(&args),
        Command::Script { name } => script(name),
        Command::ClientIp {
            peer,
            xff,
            trusted,
            key,
            ipv6_prefix,
        } => {
            let xff = xff.as_deref();
            if key {
                let k = shardlimit::client_ip_key(&peer, xff, &trusted, ipv6_prefix)?;
                println!("{k}");
            } else {
                println!("{}", shardlimit::client_ip(&peer, xff, &trusted)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            target,
            policy: p,
            concurrency,
            requests,
            keys,
            json,
            metrics,
        } => bench_command(target, p, concurrency, requests, keys, json, metrics),
    }
}

/// Validates a config file and prints its summary (`config validate`).
fn config_validate(file: String) -> shardlimit::Result<ExitCode> {
    let cfg = Config::from_file(&file)?;
    match (&cfg.shards, &cfg.cluster) {
        (Some(s), _) => println!(
            "{file}: ok: {} shard(s), {} policies",
            s.len(),
            cfg.policies.len()
        ),
        (None, Some(nodes)) => println!(
            "{file}: ok: Redis Cluster ({} seed node(s)), {} policies",
            nodes.len(),
            cfg.policies.len()
        ),
        (None, None) => println!(
            "{file}: ok: in-memory engine (no shards), {} policies",
            cfg.policies.len()
        ),
    }
    for s in cfg.shards.iter().flatten() {
        println!("  shard {}: {}", s.name, s.tls_mode());
    }
    if let (Some(nodes), Some(mode)) = (&cfg.cluster, cfg.cluster_tls_mode()) {
        println!("  cluster ({} seed nodes): {mode}", nodes.len());
    }
    for (name, p) in &cfg.policies {
        println!(
            "  {name}: {}, on_error {}{}",
            limits_text(p),
            p.on_error().name(),
            precision(p)
        );
    }
    for (plan, policies) in &cfg.plans {
        println!("  plan {plan}:");
        for (name, p) in policies {
            println!(
                "    {name}: {}, on_error {}{}",
                limits_text(p),
                p.on_error().name(),
                precision(p)
            );
        }
    }
    if cfg.shards.is_some() || cfg.cluster.is_some() {
        let handoff = human(cfg.effective_reshard_handoff());
        match cfg.longest_window() {
            _ if cfg.reshard_handoff.is_some() => {
                println!("reshard_handoff: {handoff} (set in the config)")
            }
            Some((name, _)) => println!(
                "reshard_handoff: {handoff} (default: the longest window among the \
                 policies, {name})"
            ),
            None => println!("reshard_handoff: {handoff} (default: no policies)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What changes from config `old` to `new` (`config diff`): shards, keys moved, policies.
fn config_diff(old: String, new: String, sample: u64) -> shardlimit::Result<ExitCode> {
    let (a, b) = (Config::from_file(&old)?, Config::from_file(&new)?);
    let urls = |c: &Config| -> Vec<String> {
        c.shards
            .as_ref()
            .map(|s| s.iter().map(|s| s.url.clone()).collect())
            .unwrap_or_default()
    };
    let (ua, ub) = (urls(&a), urls(&b));
    let mut moved = 0u64;
    if !ua.is_empty() && !ub.is_empty() {
        for i in 0..sample {
            let k = format!("key:{i}");
            let sa = shardlimit::routing::shard_index(&k, ua.len() as u32) as usize;
            let sb = shardlimit::routing::shard_index(&k, ub.len() as u32) as usize;
            if ua[sa] != ub[sb] {
                moved += 1;
            }
        }
    }
    let names = |c: &Config| {
        c.policies
            .keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (na, nb) = (names(&a), names(&b));
    let changed: Vec<&String> = na
        .intersection(&nb)
        .filter(|n| {
            let (x, y) = (&a.policies[*n], &b.policies[*n]);
            x.limits() != y.limits()
                || x.on_error() != y.on_error()
                || x.window_offset() != y.window_offset()
        })
        .collect();
    println!("shards: {} -> {}", ua.len(), ub.len());
    println!(
        "keys moving to another shard: {moved} of {sample} ({:.2}%)",
        moved as f64 * 100.0 / sample.max(1) as f64
    );
    println!(
        "policies added: {:?}",
        nb.difference(&na).collect::<Vec<_>>()
    );
    println!(
        "policies removed: {:?}",
        na.difference(&nb).collect::<Vec<_>>()
    );
    println!("policies changed: {changed:?}");
    Ok(ExitCode::SUCCESS)
}

/// A layered check of `--layer KEY=POLICY[:COST]` specs (`check-all`).
fn check_all(target: Target, layers: Vec<String>) -> shardlimit::Result<ExitCode> {
    let l = limiter(&target)?;
    let mut parsed = Vec::new();
    for (i, spec) in layers.iter().enumerate() {
        let bad = |m: &str| shardlimit::Error::InvalidArgument {
            what: format!("--layer #{}", i + 1),
            message: format!("{spec:?}: {m}"),
        };
        let (key, rest) = spec
            .rsplit_once('=')
            .ok_or_else(|| bad("expected KEY=POLICY[:COST]"))?;
        let (name, cost) = match rest.split_once(':') {
            Some((n, c)) => (
                n,
                c.parse::<u64>()
                    .map_err(|_| bad("COST must be a positive integer"))?,
            ),
            None => (rest, 1),
        };
        parsed.push(shardlimit::Layer::new(key, &l.policy(name)?, cost));
    }
    let d = l.check_all_blocking(&parsed)?;
    let key = &parsed[d.layer.unwrap_or(0)].key;
    println!("{}", decision_json(&d, &l, key));
    Ok(if d.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The block-list entry of `key` as JSON (`blocked`); exit 1 when not blocked.
fn blocked(target: Target, key: String) -> shardlimit::Result<ExitCode> {
    let l = limiter(&target)?;
    match l.blocked_blocking(&key)? {
        Some(b) => {
            println!(
                "{}",
                serde_json::json!({
                    "key": key,
                    "blocked": true,
                    "reason": b.reason,
                    "remaining_ms": b.remaining.map(|r| r.as_millis() as u64),
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!("{}", serde_json::json!({ "key": key, "blocked": false }));
            Ok(ExitCode::from(1))
        }
    }
}

/// Prints a Lua script (its SHA-1 on stderr) (`script`).
fn script(name: String) -> shardlimit::Result<ExitCode> {
    let all = shardlimit::scripts::all();
    match all.iter().find(|(n, _, _)| *n == name) {
        Some((_, src, sha)) => {
            print!("{src}");
            eprintln!("{sha}");
            Ok(ExitCode::SUCCESS)
        }
        None => Err(shardlimit::Error::InvalidArgument {
            what: "name".into(),
            message: format!(
                "unknown script {name:?}; one of: {}",
                all.iter()
                    .map(|(n, _, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Runs the benchmark and prints its figures (`bench`).
fn bench_command(
    target: Target,
    p: PolicyArg,
    concurrency: usize,
    requests: u64,
    keys: u64,
    json: bool,
    metrics: bool,
) -> shardlimit::Result<ExitCode> {
    let l = limiter(&target)?;
    let p = policy(&l, &p)?;
    let r = bench(&l, &p, concurrency.max(1), requests.max(1), keys.max(1))?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "decisions_per_sec": r.per_sec.round(),
                "p50_us": r.p50_us,
                "p99_us": r.p99_us,
                "allowed": r.allowed,
                "denied": r.denied,
                "errors": r.errors,
                "fallbacks": r.fallbacks,
                "requests": requests,
                "concurrency": concurrency,
                "keys": keys,
                "engine": if l.is_redis() { "redis" } else { "memory" },
                "policy": p.name(),
            })
        );
    } else {
        println!(
            "engine:        {}",
            if l.is_redis() { "redis" } else { "memory" }
        );
        println!("policy:        {} ({})", p.name(), p.algorithm());
        println!("decisions/s:   {:.0}", r.per_sec);
        println!("latency p50:   {:.1} µs", r.p50_us);
        println!("latency p99:   {:.1} µs", r.p99_us);
        println!("allowed:       {}", r.allowed);
        println!("denied:        {}", r.denied);
        if r.errors > 0 {
            println!("errors:        {}", r.errors);
        }
        if r.fallbacks > 0 {
            println!(
                "fallbacks:     {} (not decided by Redis: not counted)",
                r.fallbacks
            );
        }
    }
    if metrics {
        print!("{}", l.metrics().to_prometheus());
    }
    Ok(ExitCode::SUCCESS)
}

struct BenchResult {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// decisions of `on_error` (the shard failed): neither allowed nor denied
    fallbacks: u64,
}

#[derive(Default)]
struct TaskResult {
    lat_ns: Vec<u32>,
    allowed: u64,
    denied: u64,
    errors: u64,
    /// decisions of `on_error` (the shard failed): neither allowed nor denied
    fallbacks: u64,
}

async fn bench_task(
    l: Limiter,
    p: Policy,
    keys: Arc<Vec<String>>,
    start: u64,
    step: u64,
    count: u64,
) -> TaskResult {
    let mut r = TaskResult {
        lat_ns: Vec::with_capacity(count as usize),
        ..Default::default()
    };
    let mut i = start;
    let cc = p.algorithm() == shardlimit::Algorithm::Concurrency;
    for _ in 0..count {
        let key = &keys[(i % keys.len() as u64) as usize];
        i += step;
        let t = Instant::now();
        // a concurrency policy takes leases: acquire one (never released: they expire)
        let d = if cc {
            l.acquire(key, &p, 1).await.map(|(d, _)| d)
        } else {
            l.check(key, &p, 1).await
        };
        match d {
            // a fallback is not a decision: counted apart, never as an admission
            Ok(d) if matches!(d.source, Source::Fallback | Source::LocalFallback) => {
                r.fallbacks += 1
            }
            Ok(d) if d.allowed => r.allowed += 1,
            Ok(_) => r.denied += 1,
            Err(_) => r.errors += 1,
        }
        r.lat_ns
            .push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
    }
    r
}

fn bench(
    l: &Limiter,
    p: &Policy,
    concurrency: usize,
    requests: u64,
    nkeys: u64,
) -> shardlimit::Result<BenchResult> {
    let keys: Arc<Vec<String>> = Arc::new((0..nkeys).map(|i| format!("bench:{i}")).collect());
    // Redis: run the tasks on the limiter's own runtime, next to its connections.
    // The callers run on their own runtime thread, as a service's request handlers would,
    // while the limiter's I/O runtime drives the connections: requests that queue up while
    // the I/O thread is busy go out in one write. (SHARDLIMIT_BENCH_SAME_RUNTIME=1 runs the
    // callers on the limiter's runtime instead.)
    let own;
    let handle = match (
        l.runtime_handle()?,
        std::env::var_os("SHARDLIMIT_BENCH_SAME_RUNTIME"),
    ) {
        (Some(h), Some(_)) => h,
        _ => {
            own = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| shardlimit::Error::Internal(e.to_string()))?;
            own.handle().clone()
        }
    };
    // warm up: connect and load the script
    let warm = {
        let (l, p) = (l.clone(), p.clone());
        handle.block_on(async move {
            if p.algorithm() == shardlimit::Algorithm::Concurrency {
                l.acquire("bench:warmup", &p, 1).await.map(|(d, _)| d)
            } else {
                l.check("bench:warmup", &p, 1).await
            }
        })
    };
    warm?;
    let per_task = requests / concurrency as u64;
    let extra = requests % concurrency as u64;
    let started = Instant::now();
    let results: Vec<TaskResult> = handle.block_on(async {
        let mut tasks = Vec::with_capacity(concurrency);
        for t in 0..concurrency as u64 {
            let count = per_task + u64::from(t < extra);
            tasks.push(tokio::spawn(bench_task(
                l.clone(),
                p.clone(),
                keys.clone(),
                t,
                concurrency as u64,
                count,
            )));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.unwrap_or_default());
        }
        out
    });
    let elapsed = started.elapsed();
    let mut lat: Vec<u32> = Vec::with_capacity(requests as usize);
    let (mut allowed, mut denied, mut errors, mut fallbacks) = (0, 0, 0, 0);
    for r in results {
        lat.extend_from_slice(&r.lat_ns);
        allowed += r.allowed;
        denied += r.denied;
        errors += r.errors;
        fallbacks += r.fallbacks;
    }
    lat.sort_unstable();
    let pct = |q: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    Ok(BenchResult {
        per_sec: requests as f64 / elapsed.max(Duration::from_nanos(1)).as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        allowed,
        denied,
        errors,
        fallbacks,
    })
}
