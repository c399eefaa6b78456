//! `docs/algorithms.svg` is generated: it must be exactly what the code draws today.
//! Regenerate with `cargo run -p shardlimit-examples --bin shardlimit-plot`.

#[test]
fn committed_chart_matches_the_generator() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/algorithms.svg");
    let fresh = shardlimit_examples::chart::chart_svg();
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != fresh {
        panic!(
            "docs/algorithms.svg is stale or missing: run \
             `cargo run -p shardlimit-examples --bin shardlimit-plot` and commit the result"
        );
    }
    // the chart shows what it claims
    assert!(fresh.contains("1998 admitted in 2 s: twice the limit"));
    assert_eq!(fresh.matches("<g id=").count(), 5);
}
