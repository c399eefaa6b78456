//! The Rust worker of the cross-language override test (`scripts/test-overrides.sh`,
//! `tests/cross/overrides.py`): one long-lived limiter that checks `--key` under
//! `--policy` each time a line `check` arrives on standard input, printing the decision
//! as one JSON line. The Node and Go workers do exactly the same.
//!
//! ```text
//! shardlimit-override-worker --config CONFIG.json --policy api --key tenant:acme
//! ```

use shardlimit::Limiter;
use std::io::{BufRead, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut config, mut policy, mut key) = (None, None, None);
    while let Some(a) = args.next() {
        let v = args.next();
        match a.as_str() {
            "--config" => config = v,
            "--policy" => policy = v,
            "--key" => key = v,
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(config), Some(policy), Some(key)) = (config, policy, key) else {
        eprintln!("usage: shardlimit-override-worker --config FILE --policy NAME --key KEY");
        return ExitCode::from(2);
    };
    let limiter = match Limiter::from_config_file(&config) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() != "check" {
            continue;
        }
        let out = match rt.block_on(limiter.check_by_name(&key, &policy, 1)) {
            Ok(d) => serde_json::json!({
                "lang": "rust", "allowed": d.allowed, "limit": d.limit,
                "remaining": d.remaining, "policy": &*d.policy, "source": d.source.name(),
            }),
            Err(e) => serde_json::json!({"lang": "rust", "error": e.to_string()}),
        };
        let mut w = stdout.lock();
        let _ = writeln!(w, "{out}");
        let _ = w.flush();
    }
    ExitCode::SUCCESS
}
