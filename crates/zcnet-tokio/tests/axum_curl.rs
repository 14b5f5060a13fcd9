//! An axum `Router` served by `zcnet_tokio::axum::serve` — one call, no accept loop of
//! ours — and fetched by the real `curl`: every byte of a large `Bytes` body arrives, the
//! body went out with `MSG_ZEROCOPY`, and a route whose body is small is copied as before.
//! Then the same router through the pieces (`ZcIo::lender` + `ZcBodyLayer`) on a
//! connection served by hyper directly.

mod common;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::future::IntoFuture;
use std::process::Stdio;
use std::sync::Arc;
use tower_layer::Layer;
use zcnet::Stats;
use zcnet_tokio::axum::ZcBodyLayer;
use zcnet_tokio::{Policy, ZcConfig, ZcIo, ZcListener};

const LEN: usize = 64 << 20;

fn router() -> Router {
    let blob = Bytes::from(common::pattern_vec(0, LEN));
    Router::new()
        .route("/blob", get(move || std::future::ready(blob.clone())))
        .route("/small", get(|| async { "small and copied" }))
}

/// For a test marked ignored without `zcnet_has_curl`: the build found `curl` on PATH.
fn require_curl() {
    let runs = std::process::Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(runs, "curl, which the build found, does not run");
}

/// `curl url`, every byte of the body checked against the pattern; returns the count.
async fn curl_verified(url: &str) -> u64 {
    let mut curl = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", "--output", "-", url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting curl");
    let got = common::bounded(
        "curl's body",
        common::read_verified(curl.stdout.take().unwrap()),
    )
    .await
    .unwrap();
    assert!(curl.wait().await.unwrap().success(), "curl failed");
    got
}

async fn curl_text(url: &str) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", url])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[cfg_attr(not(zcnet_has_curl), ignore = "needs curl (apt-get install curl)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_serve_in_one_call_sends_a_large_body_zero_copy_to_curl() {
    require_curl();
    let stats = Arc::new(Stats::new());
    // Zero-copy asked for on loopback too (the kernel copies at delivery there, but the
    // sends, loans and completions are the real ones).
    let config = ZcConfig::new()
        .policy(Policy::always())
        .stats(stats.clone());
    let listener = ZcListener::bind_with("127.0.0.1:0", config).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(zcnet_tokio::axum::serve(listener, router()).into_future());
    // Two fetches: two connections, each with its own lender.
    for _ in 0..2 {
        assert_eq!(curl_verified(&format!("{base}/blob")).await, LEN as u64);
    }
    assert_eq!(
        curl_text(&format!("{base}/small")).await,
        "small and copied"
    );
    let st = stats.snapshot();
    assert!(
        st.tx_bytes_zerocopy >= 2 * LEN as u64 - (128 << 10),
        "the bodies went zero-copy: {st}"
    );
    assert!(
        st.tx_bytes_copy < 64 << 10,
        "headers and the small body only: {st}"
    );
    server.abort();
}

#[cfg_attr(not(zcnet_has_curl), ignore = "needs curl (apt-get install curl)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_and_the_lender_serve_a_router_on_a_hand_made_connection() {
    require_curl();
    let stats = Arc::new(Stats::new());
    let config = ZcConfig::new()
        .policy(Policy::always())
        .stats(stats.clone());
    let listener = ZcListener::bind_with("127.0.0.1:0", config).await.unwrap();
    let url = format!("http://{}/blob", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let io = ZcIo::new(stream, zcnet_tokio::Lender::new());
        let svc = ZcBodyLayer::new(io.lender().clone()).layer(router());
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(svc))
            .await
            .unwrap();
    });
    assert_eq!(curl_verified(&url).await, LEN as u64);
    common::bounded("the connection ends", server)
        .await
        .unwrap();
    let st = stats.snapshot();
    assert!(
        st.tx_bytes_zerocopy >= LEN as u64 - (64 << 10),
        "the body went zero-copy: {st}"
    );
}
