//! An axum service rate limited by shardlimit through the `shardlimit-tower` layer.
//!
//! ```text
//! shardlimit-example-axum [CONFIG.json] [--port PORT] [--policy NAME]
//! ```
//!
//! The config comes from the path argument or `$SHARDLIMIT_CONFIG` (a path or inline JSON);
//! with neither, the in-memory engine runs one demo policy (`demo`: 5 requests per 10 s, sliding window).
//! Requests are keyed by client IP; `$SHARDLIMIT_TRUSTED_PROXIES` (comma-separated CIDRs)
//! names the proxies whose `X-Forwarded-For` is believed. `--policy` (or
//! `$SHARDLIMIT_POLICY`, default `api`) picks the config's policy. The service listens on
//! 127.0.0.1:PORT (`--port`, `$PORT`, default 3000; 0 picks a free port) and prints the
//! address it got.

use shardlimit::{Limit, Limiter, Policy};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

struct Args {
    config: Option<String>,
    port: u16,
    policy: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        port: std::env::var("PORT")
            .ok()
            .map(|p| p.parse().map_err(|_| format!("$PORT: not a port: {p:?}")))
            .transpose()?
            .unwrap_or(3000),
        policy: std::env::var("SHARDLIMIT_POLICY").unwrap_or_else(|_| "api".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => {
                let p = it.next().ok_or("--port needs a value")?;
                args.port = p
                    .parse()
                    .map_err(|_| format!("--port: not a port: {p:?}"))?;
            }
            "--policy" => args.policy = it.next().ok_or("--policy needs a value")?,
            "-h" | "--help" => {
                return Err(
                    "usage: shardlimit-example-axum [CONFIG.json] [--port PORT] [--policy NAME]"
                        .into(),
                )
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ if args.config.is_none() => args.config = Some(a),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    Ok(args)
}

/// The limiter and the policy the service enforces.
fn limiter_and_policy(args: &Args) -> shardlimit::Result<(Limiter, Policy, &'static str)> {
    let limiter = match &args.config {
        Some(path) => Limiter::from_config_file(path)?,
        None => Limiter::from_env()?,
    };
    if args.config.is_none() && std::env::var("SHARDLIMIT_CONFIG").is_err() {
        let demo = Policy::new("demo", Limit::sliding_window(5, Duration::from_secs(10)))?;
        return Ok((limiter, demo, "in-memory (no config: demo policy)"));
    }
    let policy = limiter.policy(&args.policy)?;
    let engine = if limiter.is_redis() {
        "redis"
    } else {
        "in-memory"
    };
    Ok((limiter, policy, engine))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let (limiter, policy, engine) = match limiter_and_policy(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("shardlimit-example-axum: {e}");
            return ExitCode::from(2);
        }
    };
    let trusted: Vec<String> = std::env::var("SHARDLIMIT_TRUSTED_PROXIES")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let policy_desc = format!("{} ({})", policy.name(), policy.limit());
    let app = match shardlimit_examples::app(limiter, policy, &trusted) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("shardlimit-example-axum: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "shardlimit-example-axum: cannot listen on 127.0.0.1:{}: {e}",
                args.port
            );
            return ExitCode::from(1);
        }
    };
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    // tests read this line to find the port
    println!("listening on http://{addr} engine={engine} policy={policy_desc}");
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shardlimit-example-axum: {e}");
            ExitCode::from(1)
        }
    }
}
