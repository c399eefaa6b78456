//! `shardlimit serve`: the limits of a shardlimit config as a service, for what cannot
//! embed the library: Envoy's rate limit service over gRPC (`grpc`), and an HTTP API on
//! loopback for sidecar callers and for nginx `auth_request`, Traefik ForwardAuth and
//! HAProxy (`http`). It uses only the `shardlimit` crate's public API, so a key limited
//! here and the same key checked by a library (Python, Go, Node, Rust, C) spend one budget.
//!
//! The guide is `docs/serve.md`.

pub mod gateway;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod proto;
pub mod rls;

use arc_swap::ArcSwap;
use clap::Parser;
use gateway::Gateway;
use shardlimit::{Config, Limiter};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// The command line of `shardlimit serve` (and of the `shardlimit-serve` binary).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "shardlimit-serve",
    version,
    about = "Serve a shardlimit config: Envoy's rate limit service (gRPC) and an HTTP check/auth API.",
    long_about = "Serve a shardlimit config as a service.\n\n\
gRPC (--grpc): envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit and grpc.health.v1.Health. \
The config's \"gateway\" section maps domains and descriptors to policies and keys; the descriptors \
of one request are one layered check (a denial consumes nothing). The Redis deadline follows the \
call's gRPC deadline (Envoy sends 20 ms), so the policies' on_error modes decide, not Envoy's timeout.\n\n\
HTTP (--http), JSON in and out: POST /check, /peek, /check_all, /charge, /refund, /acquire, /release, \
/reserve, /settle, /overrides/{set,get,delete}; any method on /auth (nginx auth_request, Traefik \
ForwardAuth, HAProxy) with policy, key and cost in the query or in X-Shardlimit-* headers; \
GET /healthz, /readyz, /metrics (Prometheus). Decisions answer 200 allowed, 429 denied, 503 when a \
policy's on_error mode refused; /auth denies with --auth-deny-status (403 for nginx).\n\n\
Signals: SIGHUP (and, with --watch, a change of the file) reloads the config file (policies, shards with the resharding handoff, gateway); \
SIGTERM and SIGINT stop accepting, finish the requests in flight (up to --shutdown-grace) and exit 0.\n\n\
Listen on loopback or a private interface: the API has no authentication of its own.\n\n\
Guide: docs/serve.md.",
    after_help = "Examples:\n  shardlimit serve --config shard-config.json\n  shardlimit serve --config /etc/shardlimit/config.json --http 127.0.0.1:8080 --grpc 127.0.0.1:8081 --log-format json"
)]
pub struct Options {
    /// The config file (default: $SHARDLIMIT_CONFIG). Its "gateway" section maps Envoy's
    /// descriptors to policies.
    #[arg(long, env = "SHARDLIMIT_CONFIG")]
    pub config: PathBuf,
    /// HTTP address: host:port, unix:/path (a Unix domain socket) or "off".
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http: String,
    /// gRPC address for Envoy's rate limit service: host:port, unix:/path (a Unix domain
    /// socket; Envoy's cluster then has a `pipe` address) or "off".
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub grpc: String,
    /// Permissions of the Unix sockets, octal: 660 lets the owner and the group connect
    /// (put the proxy's user in the service's group). The socket is made with the
    /// process's umask and changed to this before the service accepts a connection; a
    /// stale socket left at the path by a service that died is replaced, a live one or a
    /// file that is not a socket is an error; the socket is removed at exit.
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Largest HTTP request body accepted, bytes (larger: 413).
    #[arg(long, default_value_t = 65_536)]
    pub max_body: usize,
    /// Requests (HTTP and gRPC together) handled at once; more are answered at once with
    /// 503 / RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 1024)]
    pub max_concurrency: usize,
    /// The status /auth answers when a request is denied: 403 for nginx auth_request (which
    /// turns any other status into a 500; map it back with `error_page 403 =429`), 429 for
    /// Traefik ForwardAuth and HAProxy. A request may set `deny_status` in its query.
    #[arg(long, default_value_t = 403)]
    pub auth_deny_status: u16,
    /// Time kept back from a gRPC deadline to answer Envoy in time, milliseconds.
    #[arg(long, default_value_t = 5)]
    pub deadline_margin_ms: u64,
    /// How long to wait for the shards at start-up (connect and load the scripts); the
    /// service starts anyway and the policies' on_error modes decide until they answer.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// How long requests in flight may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Also reload when the config file changes (its modification time or size), looked
    /// at this often, e.g. 2s. Default: only on SIGHUP.
    #[arg(long, value_parser = parse_duration)]
    pub watch: Option<Duration>,
    /// Log format on stderr: text or json (one object a line).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "info")]
    pub log_level: tracing::Level,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "{s}: expected octal permissions up to 777, e.g. 660"
        )),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    shardlimit::parse_duration_us("duration", s)
        .map(Duration::from_micros)
        .map_err(|e| e.to_string())
}

/// What a reload swaps: the limiter's config is reloaded in place; the gateway mapping
/// is swapped here.
pub struct State {
    pub limiter: Limiter,
    pub gateway: ArcSwap<Gateway>,
    pub config_path: PathBuf,
    pub permits: Arc<Semaphore>,
    pub max_body: usize,
    pub auth_deny_status: u16,
    pub deadline_margin: Duration,
    pub metrics: metrics::ServeMetrics,
}

impl State {
    /// Reads and validates the config file: the core's config and the gateway section.
    pub fn load(path: &std::path::Path) -> Result<(Config, Gateway), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config = Config::from_json(&text).map_err(|e| e.to_string())?;
        let root: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let gw = Gateway::from_config_json(&root, &config)?;
        Ok((config, gw))
    }

    pub fn new(opts: &Options) -> Result<State, String> {
        let (config, gw) = State::load(&opts.config)?;
        let limiter = Limiter::new(config).map_err(|e| e.to_string())?;
        Ok(State::with_limiter(limiter, gw, opts))
    }

    pub fn with_limiter(limiter: Limiter, gw: Gateway, opts: &Options) -> State {
        State {
            limiter,
            gateway: ArcSwap::from_pointee(gw),
            config_path: opts.config.clone(),
            permits: Arc::new(Semaphore::new(opts.max_concurrency.max(1))),
            max_body: opts.max_body,
            auth_deny_status: opts.auth_deny_status,
            deadline_margin: Duration::from_millis(opts.deadline_margin_ms),
            metrics: metrics::ServeMetrics::default(),
        }
    }

    /// SIGHUP: the config file again. Nothing changes unless all of it is valid.
    pub fn reload(&self) -> Result<String, String> {
        let (config, gw) = State::load(&self.config_path)?;
        let report = self.limiter.reload(config).map_err(|e| e.to_string())?;
        let domains = gw.domains.len();
        self.gateway.store(Arc::new(gw));
        Ok(format!(
            "policies added {:?}, removed {:?}, changed {:?}; shards changed: {}; handoff: {}; gateway domains: {domains}",
            report.policies_added,
            report.policies_removed,
            report.policies_changed,
            report.engine_changed,
            report.handoff
        ))
    }
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    /// A Unix domain socket at this path.
    Unix(PathBuf),
}

/// Parses "off", "unix:/path" or host:port.
pub fn listen_addr(s: &str, what: &str) -> Result<Option<Listen>, String> {
    if s == "off" {
        return Ok(None);
    }
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!(
                "--{what} {s}: the socket's path is missing (unix:/path)"
            ));
        }
        // sockaddr_un holds 108 bytes, the last one a NUL
        if path.len() > 107 {
            return Err(format!(
                "--{what} {s}: a Unix socket's path is at most 107 bytes, this one has {}",
                path.len()
            ));
        }
        return Ok(Some(Listen::Unix(PathBuf::from(path))));
    }
    s.parse()
        .map(|a| Some(Listen::Tcp(a)))
        .map_err(|e| format!("--{what} {s}: {e} (expected host:port, unix:/path or off)"))
}

/// A bound listener. A Unix socket's file is removed when this is dropped, unless another
/// service has replaced it meanwhile.
pub enum Bound {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, SocketFile),
}

/// The file of a Unix socket this service made: removed on drop if it is still the same
/// file (same device and inode).
pub struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if (m.dev(), m.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds `l`. A Unix socket: a stale socket at the path (nothing accepts on it) is
/// removed first; a live one, or anything that is not a socket, is an error and is left
/// alone; the new socket gets `mode` before anything is accepted.
pub async fn bind(l: &Listen, mode: u32, what: &str) -> Result<Bound, String> {
    match l {
        Listen::Tcp(a) => tokio::net::TcpListener::bind(a)
            .await
            .map(Bound::Tcp)
            .map_err(|e| format!("--{what} {a}: {e}")),
        Listen::Unix(path) => {
            use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
            let shown = path.display();
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_socket() => {
                    match std::os::unix::net::UnixStream::connect(path) {
                        Ok(_) => {
                            return Err(format!(
                                "--{what} unix:{shown}: another process is listening on this socket"
                            ))
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                            std::fs::remove_file(path).map_err(|e| {
                                format!("--{what} unix:{shown}: cannot remove the stale socket: {e}")
                            })?;
                            tracing::info!(path = %shown, "removed a stale socket (nothing listened on it)");
                        }
                        Err(e) => {
                            return Err(format!(
                                "--{what} unix:{shown}: a socket is there and cannot be probed ({e}): not removed"
                            ))
                        }
                    }
                }
                Ok(_) => {
                    return Err(format!(
                        "--{what} unix:{shown}: the path exists and is not a socket: not removed"
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("--{what} unix:{shown}: {e}")),
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| format!("--{what} unix:{shown}: {e}"))?;
            let m = std::fs::symlink_metadata(path)
                .map_err(|e| format!("--{what} unix:{shown}: {e}"))?;
            let file = SocketFile {
                path: path.clone(),
                id: (m.dev(), m.ino()),
            };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("--{what} unix:{shown}: cannot set its mode {mode:o}: {e}"))?;
            Ok(Bound::Unix(listener, file))
        }
    }
}

impl Bound {
    /// What to log: the bound address or socket path.
    pub fn describe(&self) -> String {
        match self {
            Bound::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|e| e.to_string()),
            Bound::Unix(_, f) => format!("unix:{}", f.path.display()),
        }
    }
}

pub fn init_logging(opts: &Options) {
    let b = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(opts.log_level)
        .with_target(false);
    let _ = if opts.log_format == "json" {
        b.json().flatten_event(true).try_init()
    } else {
        b.with_ansi(false).try_init()
    };
}

/// Runs the service until SIGTERM or SIGINT. Returns an error message for a bad config or
/// an address that cannot be bound.
pub async fn run(opts: Options) -> Result<(), String> {
    let http_addr = listen_addr(&opts.http, "http")?;
    let grpc_addr = listen_addr(&opts.grpc, "grpc")?;
    if http_addr.is_none() && grpc_addr.is_none() {
        return Err("--http and --grpc are both off: nothing to serve".into());
    }
    if http_addr.is_some() && http_addr == grpc_addr {
        return Err("--http and --grpc are the same address".into());
    }
    let state = Arc::new(State::new(&opts)?);
    if state.limiter.is_redis() {
        match state.limiter.connect(opts.connect_timeout).await {
            Ok(()) => tracing::info!("connected to the shards"),
            Err(e) => {
                tracing::warn!(error = %e, "shards not reachable yet: on_error decides until they answer")
            }
        }
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    // bound before serving either, so that a bad address leaves nothing behind
    let http_bound = match &http_addr {
        Some(a) => Some(bind(a, opts.socket_mode, "http").await?),
        None => None,
    };
    let grpc_bound = match &grpc_addr {
        Some(a) => Some(bind(a, opts.socket_mode, "grpc").await?),
        None => None,
    };
    if let Some(b) = http_bound {
        tracing::info!(addr = %b.describe(), "HTTP listening");
        tasks.push(tokio::spawn(match b {
            Bound::Tcp(l) => Box::pin(http::serve(state.clone(), l, stop_rx.clone()))
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
            Bound::Unix(l, file) => {
                let (state, stop) = (state.clone(), stop_rx.clone());
                Box::pin(async move {
                    http::serve(state, l, stop).await;
                    drop(file);
                })
            }
        }));
    }
    if let Some(b) = grpc_bound {
        tracing::info!(addr = %b.describe(), "gRPC listening");
        tasks.push(tokio::spawn(match b {
            Bound::Tcp(l) => Box::pin(grpc::serve(state.clone(), l, stop_rx.clone()))
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
            Bound::Unix(l, file) => {
                let (state, stop) = (state.clone(), stop_rx.clone());
                Box::pin(async move {
                    grpc::serve_unix(state, l, stop).await;
                    drop(file);
                })
            }
        }));
    }
    if let Some(every) = opts.watch {
        tokio::spawn(watch_file(state.clone(), every, stop_rx.clone()));
    }
    signals(&state).await?;
    tracing::info!(grace = ?opts.shutdown_grace, "stopping: finishing the requests in flight");
    let _ = stop_tx.send(true);
    let all = async {
        for t in tasks {
            let _ = t.await;
        }
    };
    if tokio::time::timeout(opts.shutdown_grace, all)
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the grace period: exiting");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Waits for SIGTERM or SIGINT; reloads on each SIGHUP meanwhile.
async fn signals(state: &State) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
            _ = hup.recv() => match state.reload() {
                Ok(what) => tracing::info!(config = %state.config_path.display(), changes = %what, "reloaded"),
                Err(e) => tracing::error!(config = %state.config_path.display(), error = %e, "reload refused: the previous config stays in force"),
            },
        }
    }
}

/// Reloads the config whenever its file's modification time or size changes, looked at
/// every `every`, until `stop`. A file that does not validate is logged and skipped (the
/// config in force stays) until it changes again.
pub async fn watch_file(state: Arc<State>, every: Duration, mut stop: watch::Receiver<bool>) {
    let stamp = |p: &std::path::Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut last = stamp(&state.config_path);
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = stamp(&state.config_path);
        if now == last {
            continue;
        }
        last = now;
        match state.reload() {
            Ok(what) => {
                tracing::info!(config = %state.config_path.display(), changes = %what, "reloaded (file changed)")
            }
            Err(e) => {
                tracing::error!(config = %state.config_path.display(), error = %e, "reload refused: the previous config stays in force")
            }
        }
    }
}
