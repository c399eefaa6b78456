//! The axum example of docs/features.md ("HTTP services in Rust"), as written, compiled against this
//! crate with its default features (as a user's `shardlimit-tower = "..."` gets it) and
//! served over loopback: `IpKey` must find the client address in axum's `ConnectInfo`, so
//! the login route answers 200 five times and then 429, never 500.
//!
//! `readme_block_is_this_one` holds the copy below equal to the block in docs/features.md, so the
//! example cannot change without this test running the new text.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The block in docs/features.md, byte for byte between the fences (checked below).
macro_rules! readme_example {
    ($listener:ident) => {{
use axum::extract::Request;
use axum::routing::{get, post};
use axum::{Extension, Router};
use shardlimit::{Decision, Layer, Limiter};
use shardlimit_tower::{Check, Error, IpKey, RateLimitLayer};
use std::net::SocketAddr;

let limiter = Limiter::from_config_file("shard-config.json")?;
let login = limiter.policy("login")?;
let ip = IpKey::new(login.clone(), &["10.0.0.0/8"])?; // X-Forwarded-For only from these proxies
let login_limits = RateLimitLayer::new(limiter.clone(), move |req: &Request| -> Result<Check, Error> {
    if req.headers().contains_key("x-internal-token") {
        return Ok(Check::Skip); // not limited, no headers
    }
    let mut layers = vec![Layer::new(ip.key(req)?, &login, 1)]; // per client IP...
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        layers.push(Layer::new(format!("user:{user}"), &login, 1)); // ...and per account
    }
    Ok(Check::All(layers)) // all must allow; a denial consumes nothing
});
let app = Router::new()
    .route("/login", post(|d: Option<Extension<Decision>>| async move {
        d.map_or("internal".to_string(), |Extension(d)| format!("{} left", d.remaining))
    }).layer(login_limits)) // this route only
    .route("/health", get(|| async { "ok" }));
axum::serve($listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    }};
}

const THIS_FILE: &str = include_str!("readme_axum.rs");
const README: &str = include_str!("../../docs/features.md");

/// The first ```rust block after `heading` in `text`.
fn block_after<'a>(text: &'a str, heading: &str) -> &'a str {
    let at = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let rest = &text[at..];
    let start = rest.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let len = rest[start..].find("```").expect("the block's end");
    &rest[start..start + len]
}

#[test]
fn readme_block_is_this_one() {
    let readme = block_after(README, "### HTTP services in Rust");
    let start = THIS_FILE.find("{{\nuse axum").expect("the macro") + 3;
    let end = THIS_FILE.find("    }};\n}").expect("the macro's end");
    let copy = THIS_FILE[start..end].replace("$listener", "listener");
    assert_eq!(
        copy, readme,
        "the axum example of docs/features.md changed: copy it into tests/readme_axum.rs"
    );
}

async fn serve(listener: tokio::net::TcpListener) -> Result<(), Box<dyn std::error::Error>> {
    readme_example!(listener);
    Ok(())
}

/// One HTTP/1.1 request over a fresh loopback connection: (status, headers, body).
fn request(port: u16, method: &str, path: &str, extra: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head[9..12].parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

#[test]
fn readme_example_serves_200_then_429() {
    // the example reads shard-config.json from the working directory: the README's login
    // policy (5 a minute, on_error closed), on the in-memory engine (no shards)
    let dir = std::env::temp_dir().join(format!("shardlimit-readme-axum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("shard-config.json"),
        r#"{"policies": {"login": {"algorithm": "fixed_window", "limit": 5, "window": "1m", "on_error": "closed"}}}"#,
    )
    .unwrap();
    std::env::set_current_dir(&dir).unwrap(); // the only test in this binary that reads it

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = rt.spawn(async move { serve(listener).await.map_err(|e| e.to_string()) });

    for left in (0..5).rev() {
        let (status, head, body) = request(port, "POST", "/login", "");
        assert_eq!(status, 200, "{head}\n{body}");
        assert_eq!(body, format!("{left} left"));
        assert!(head.contains("x-ratelimit-limit: 5"), "{head}");
    }
    let (status, head, body) = request(port, "POST", "/login", "");
    assert_eq!(status, 429, "{head}\n{body}");
    assert!(head.contains("retry-after: "), "{head}");
    // another account from the same address shares the address's budget
    let (status, _, _) = request(port, "POST", "/login", "X-User: bob\r\n");
    assert_eq!(status, 429);
    let (status, head, body) = request(port, "POST", "/login", "X-Internal-Token: t\r\n");
    assert_eq!((status, body.as_str()), (200, "internal"));
    assert!(!head.contains("x-ratelimit"), "{head}");
    let (status, _, body) = request(port, "GET", "/health", "");
    assert_eq!((status, body.as_str()), (200, "ok"));

    assert!(
        !server.is_finished(),
        "the server stopped: {:?}",
        rt.block_on(server)
    );
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a peer address the error names what this build reads: with the `axum` feature
/// (the default) ConnectInfo and how to serve it, without it the missing feature.
#[test]
fn no_peer_error_names_the_cause() {
    use shardlimit::{Limit, Policy};
    let p = Policy::new("p", Limit::fixed_window(1, Duration::from_secs(1))).unwrap();
    let ip = shardlimit_tower::IpKey::new(p, &[] as &[&str]).unwrap();
    let req = http::Request::new(String::new());
    let msg = ip.key(&req).unwrap_err().to_string();
    if cfg!(feature = "axum") {
        assert!(msg.contains("into_make_service_with_connect_info"), "{msg}");
    } else {
        assert!(msg.contains("without its \"axum\" feature"), "{msg}");
        assert!(!msg.contains("serve with"), "{msg}");
    }
}
