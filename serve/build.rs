//! Generates Envoy's rate limit service (server and client) from the vendored protos in
//! `proto/`, with protox: no `protoc` binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .include_file("protos.rs")
        .compile_fds(fds)?;
    Ok(())
}
