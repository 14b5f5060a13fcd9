//! An axum `Router` served with zero-copy response bodies (feature `axum`).
//!
//! A zero-copy body needs the same [`Lender`] in two places: in the connection's I/O
//! ([`ZcIo`]), which sends a slice zero-copy only if it lies inside a lent `Bytes`, and in
//! every response body ([`ZcBody`]), which lends its large frames. `axum::serve` makes the
//! connection's I/O from a `Listener` and its service from a make-service that sees that I/O
//! (`IncomingStream::io`), so both ends meet here:
//!
//! * [`ZcListener`] is an `axum::serve::Listener` whose connections are [`ZcIo`]s, each
//!   with a lender of its own ([`ZcIo::lender`]);
//! * [`ZcMakeService`] gives each connection the router behind a [`ZcBodyLayer`] made from
//!   that lender, which wraps every response body in a [`ZcBody`].
//!
//! [`serve`] puts the two together: `zcnet_tokio::axum::serve(listener, router).await`.
//! A router's other middleware is untouched, and a body that is not made of large `Bytes`
//! frames is copied as before.

use crate::hyper_io::{Lender, ZcBody, ZcIo};
use crate::stream::ZcListener;
use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use axum::Router;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// Serves `router` on `listener` as `axum::serve` does, every connection a [`ZcIo`] and
/// every response body a [`ZcBody`] lending to it: large `Bytes` frames go out zero-copy.
/// The returned `axum::serve::Serve` is awaited (it runs until an accept error it cannot
/// retry), or given `.with_graceful_shutdown(signal)` first.
///
/// ```no_run
/// use axum::{routing::get, Router};
/// use bytes::Bytes;
/// # async fn run() -> std::io::Result<()> {
/// let body = Bytes::from(vec![7u8; 64 << 20]);
/// let router = Router::new().route("/blob", get(move || async move { body.clone() }));
/// let listener = zcnet_tokio::ZcListener::bind("0.0.0.0:8080").await?;
/// zcnet_tokio::axum::serve(listener, router).await
/// # }
/// ```
pub fn serve(
    listener: ZcListener,
    router: Router,
) -> axum::serve::Serve<ZcListener, ZcMakeService, ZcBodyService<Router>> {
    axum::serve(listener, ZcMakeService::new(router))
}

impl Listener for ZcListener {
    type Io = ZcIo;
    type Addr = SocketAddr;

    /// Accepts the next connection as a [`ZcIo`] with a fresh [`Lender`]. Errors are
    /// retried, as axum's own `TcpListener` does: at once for a connection that failed
    /// while being accepted, after a second for anything else (`EMFILE`: the process is
    /// out of descriptors, and retrying at once would spin).
    async fn accept(&mut self) -> (ZcIo, SocketAddr) {
        loop {
            match ZcListener::accept(self).await {
                Ok((stream, addr)) => return (ZcIo::new(stream, Lender::new()), addr),
                Err(e) if is_connection_error(&e) => continue,
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        ZcListener::local_addr(self)
    }
}

/// An error of one connection, not of the listener (axum's own rule).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// The make-service of [`serve`]: each connection gets `router` behind a [`ZcBodyLayer`]
/// made from its [`ZcIo`]'s lender. For `axum::serve(listener, make_service)` with a
/// [`ZcListener`].
#[derive(Debug, Clone)]
pub struct ZcMakeService {
    router: Router,
}

impl ZcMakeService {
    /// Serves `router` on every connection.
    pub fn new(router: Router) -> Self {
        ZcMakeService { router }
    }
}

impl Service<IncomingStream<'_, ZcListener>> for ZcMakeService {
    type Response = ZcBodyService<Router>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, conn: IncomingStream<'_, ZcListener>) -> Self::Future {
        let layer = ZcBodyLayer::new(conn.io().lender().clone());
        std::future::ready(Ok(layer.layer(self.router.clone())))
    }
}

/// A tower layer that wraps every response body in a [`ZcBody`] lending to one
/// connection's [`Lender`] (the one its [`ZcIo`] holds: [`ZcIo::lender`]). For a server
/// that builds its connections itself (hyper's `serve_connection`).
#[derive(Debug, Clone)]
pub struct ZcBodyLayer {
    lender: Lender,
}

impl ZcBodyLayer {
    /// Lends to `lender`.
    pub fn new(lender: Lender) -> Self {
        ZcBodyLayer { lender }
    }
}

impl<S> Layer<S> for ZcBodyLayer {
    type Service = ZcBodyService<S>;

    fn layer(&self, inner: S) -> ZcBodyService<S> {
        ZcBodyService {
            inner,
            lender: self.lender.clone(),
        }
    }
}

/// The service [`ZcBodyLayer`] makes: `inner`, its response bodies wrapped in [`ZcBody`].
#[derive(Debug, Clone)]
pub struct ZcBodyService<S> {
    inner: S,
    lender: Lender,
}

impl<S, B> Service<Request<B>> for ZcBodyService<S>
where
    S: Service<Request<B>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let lender = self.lender.clone();
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|body| Body::new(ZcBody::new(body, lender))))
        })
    }
}
