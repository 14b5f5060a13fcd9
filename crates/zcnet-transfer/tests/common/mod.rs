//! What the tests of a session over several streams share: a sender of a whole tree over N
//! streams, and a `--once` receiver on a thread of its own.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use zcnet::{Sender, SenderConfig, TxPath};
use zcnet_transfer::server::{serve, Quiet, ServerConfig};
use zcnet_transfer::session::{SendOptions, SessionReport, TransferError};
use zcnet_transfer::streams::{send_streams, StreamsReport};
use zcnet_transfer::tree::Walk;

/// Sends `src` (a file or a tree) over `streams` streams, verified, speaking at most
/// protocol `max_version`. (Not every test that shares this module sends a tree.)
#[allow(dead_code)]
pub fn send_as(
    to: SocketAddr,
    src: &Path,
    streams: usize,
    max_version: u16,
) -> Result<StreamsReport, TransferError> {
    let mut w = Walk::new();
    w.add(src).unwrap();
    let connect = || -> Result<Sender, TransferError> {
        let mut c = SenderConfig::new(TxPath::Copy);
        c.timeout = Some(Duration::from_secs(20));
        Ok(Sender::connect(to, &c)?)
    };
    let mut o = SendOptions::default();
    o.verify = true;
    o.max_version = max_version;
    send_streams(&connect, streams, w.sources, &o, &mut |_| {})
}

/// Serves `listener` into `dir` with `cfg` on a thread of its own.
pub fn serve_once(
    listener: TcpListener,
    dir: &Path,
    cfg: ServerConfig,
) -> std::thread::JoinHandle<Option<Result<SessionReport, TransferError>>> {
    let d = dir.to_path_buf();
    std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        serve(listener, &d, cfg, &stop, Arc::new(Quiet)).unwrap()
    })
}

/// `--once`, with an idle timeout that ends a test's hang rather than waiting for ever.
pub fn once_cfg() -> ServerConfig {
    let mut cfg = ServerConfig::default();
    cfg.once = true;
    cfg.idle_timeout = Duration::from_secs(20);
    cfg
}
