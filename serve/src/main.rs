//! `shardlimit-serve` (also run as `shardlimit serve`): see `--help` and docs/serve.md.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let opts = shardlimit_serve::Options::parse();
    shardlimit_serve::init_logging(&opts);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shardlimit serve: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(shardlimit_serve::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // logged once, in the chosen format (stderr)
            tracing::error!(error = %e, "cannot serve");
            ExitCode::from(2)
        }
    }
}
