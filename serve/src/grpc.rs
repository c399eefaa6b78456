//! The gRPC server: Envoy's rate limit service and gRPC health.

use crate::proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::State;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

pub struct Rls {
    pub state: Arc<State>,
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let Ok(_permit) = self.state.permits.clone().try_acquire_owned() else {
            self.state
                .metrics
                .overloaded
                .fetch_add(1, Ordering::Relaxed);
            self.state.metrics.grpc("RESOURCE_EXHAUSTED");
            return Err(Status::resource_exhausted(
                "shardlimit serve: --max-concurrency requests in flight",
            ));
        };
        let deadline = crate::rls::deadline_of(request.metadata());
        let r = crate::rls::should_rate_limit(&self.state, request.into_inner(), deadline).await;
        self.state.metrics.grpc(match &r {
            Ok(resp) if resp.overall_code == 2 => "OK_OVER_LIMIT",
            Ok(_) => "OK",
            Err(s) => code_name(s.code()),
        });
        r.map(Response::new)
    }
}

fn code_name(c: tonic::Code) -> &'static str {
    match c {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        _ => "OTHER",
    }
}

/// Serves until `stop` turns true; then the health service says NOT_SERVING and the
/// calls in flight finish.
pub async fn serve(state: Arc<State>, listener: TcpListener, stop: watch::Receiver<bool>) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    serve_incoming(state, incoming, stop).await
}

/// [`serve`] on a Unix domain socket.
pub async fn serve_unix(state: Arc<State>, listener: UnixListener, stop: watch::Receiver<bool>) {
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| s);
        Some((next, l))
    });
    serve_incoming(state, incoming, stop).await
}

async fn serve_incoming<I, IO, IE>(state: Arc<State>, incoming: I, mut stop: watch::Receiver<bool>)
where
    I: futures_util::Stream<Item = Result<IO, IE>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<RateLimitServiceServer<Rls>>().await;
    let svc = RateLimitServiceServer::new(Rls { state })
        // a request is a few descriptors: 1 MiB is far more than any real one
        .max_decoding_message_size(1 << 20);
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
        reporter
            .set_not_serving::<RateLimitServiceServer<Rls>>()
            .await;
    };
    if let Err(e) = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
    {
        tracing::error!(error = %e, "gRPC server failed");
    }
}
