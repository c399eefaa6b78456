//! Writes the algorithm chart: `shardlimit-plot [OUT.svg]` (default `docs/algorithms.svg`)
//! and prints the numbers behind it. See `shardlimit_examples::chart`.

use shardlimit_examples::chart;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/algorithms.svg".to_string());
    if out.starts_with('-') {
        eprintln!("usage: shardlimit-plot [OUT.svg]");
        return ExitCode::from(2);
    }
    let series = chart::simulate();
    if let Err(e) = std::fs::write(&out, chart::svg(&series)) {
        eprintln!("shardlimit-plot: cannot write {out}: {e}");
        return ExitCode::from(1);
    }
    println!(
        "{:<15} {:>14} {:>15} {:>9}",
        "algorithm", "most in 2 s", "most in 60 s", "total"
    );
    for s in &series {
        println!(
            "{:<15} {:>14} {:>15} {:>9}",
            s.algorithm, s.max_2s, s.max_60s, s.total
        );
    }
    println!("wrote {out}");
    ExitCode::SUCCESS
}
