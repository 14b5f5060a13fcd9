//! An unmodified hyper server on a `ZcIo`, fetched by the real `curl`: every byte of the
//! body arrives, and the large frames went out with `MSG_ZEROCOPY` (hyper's vectored writes
//! pointed into memory a `ZcBody` lent), while the headers were copied.

mod common;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use zcnet_testbed::pattern::pattern;
use zcnet_tokio::{Lender, Policy, ZcBody, ZcConfig, ZcIo, ZcStream};

struct PatternBody {
    pos: u64,
    total: u64,
    frame: u64,
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.pos >= self.total {
            return Poll::Ready(None);
        }
        let n = self.frame.min(self.total - self.pos) as usize;
        let frame = Bytes::from_static(pattern(self.pos, n));
        self.pos += n as u64;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.total - self.pos)
    }
}

async fn serve_one_and_fetch(total: u64, frame: u64) -> zcnet::StatsSnapshot {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let stream = ZcStream::from_tokio(tcp, ZcConfig::new().policy(Policy::always())).unwrap();
        let stats = stream.stats().clone();
        let lender = Lender::new();
        let io = ZcIo::new(stream, lender.clone());
        let svc = service_fn(move |_req| {
            let body = ZcBody::new(
                PatternBody {
                    pos: 0,
                    total,
                    frame,
                },
                lender.clone(),
            );
            async move { Ok::<_, Infallible>(hyper::Response::new(body)) }
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), svc)
            .await
            .unwrap();
        stats.snapshot()
    });
    let mut curl = tokio::process::Command::new("curl")
        .args(["-sS", "--fail", "--output", "-", &url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting curl");
    let got = common::read_verified(curl.stdout.take().unwrap())
        .await
        .unwrap();
    assert!(curl.wait().await.unwrap().success(), "curl failed");
    assert_eq!(got, total, "every byte of the body");
    server.await.unwrap()
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

#[cfg_attr(not(zcnet_has_curl), ignore = "needs curl (apt-get install curl)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_gets_every_byte_and_large_frames_went_zero_copy() {
    require_curl();
    let total = 256u64 << 20;
    let st = serve_one_and_fetch(total, 1 << 20).await;
    assert!(st.tx_bytes() >= total, "{st}");
    // The body went zero-copy; only headers (well under 1 KiB) were copied.
    assert!(st.tx_bytes_zerocopy >= total - (64 << 10), "{st}");
    assert!(st.tx_bytes_copy < 4096, "{st}");
    eprintln!("hyper + curl: {st}");
}

#[cfg_attr(not(zcnet_has_curl), ignore = "needs curl (apt-get install curl)")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_below_the_threshold_are_copied_and_still_every_byte_arrives() {
    require_curl();
    let total = 8u64 << 20;
    let st = serve_one_and_fetch(total, 4096).await;
    assert_eq!(st.tx_bytes_zerocopy, 0, "{st}");
    assert!(st.tx_bytes_copy >= total, "{st}");
}
