//! A stream's per-send choice (`auto`): the COPIED demotion counted in bytes, and the
//! run-time cost check measuring zero-copy against copy on the connection — every byte
//! verified at the receiver, every decision visible in `Stats`.

mod common;

use bytes::Bytes;
use common::{pair, pattern_vec, read_verified};
use tokio::io::AsyncWriteExt;
use zcnet::{FallbackReason, StatsSnapshot};
use zcnet_testbed::topo::{veth_pair, Topo};
use zcnet_tokio::{Policy, ZcConfig, ZcStream};

const MIB: usize = 1 << 20;

/// Sends `total` bytes of the pattern in `size` pieces with `send_bytes`; the receiver
/// checks every byte. Returns the sender's counters.
async fn send_verified(
    topo: Topo<'_>,
    config: ZcConfig,
    total: usize,
    size: usize,
) -> StatsSnapshot {
    let (mut s, r) = pair(topo, config).await;
    let reader = tokio::spawn(read_verified(r));
    send_pattern(&mut s, total, size).await;
    assert_eq!(
        reader.await.unwrap().unwrap(),
        total as u64,
        "every byte, in order"
    );
    assert_eq!(s.loans_in_flight(), 0);
    s.stats().snapshot()
}

async fn send_pattern(s: &mut ZcStream, total: usize, size: usize) {
    let data = Bytes::from(pattern_vec(0, total));
    let mut off = 0;
    while off < total {
        let n = size.min(total - off);
        let sent = s.send_bytes(data.slice(off..off + n)).await.unwrap();
        assert_eq!(sent.len, n);
        off += n;
    }
    s.flush_loans().await.unwrap();
    s.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_copied_notifications_demote_by_the_bytes_they_cover() {
    // The notification limit out of reach: only the byte count can demote. On loopback,
    // so the stream must be told to ask there at all.
    let policy = Policy::default().with_demotion(Some(u32::MAX));
    let config = ZcConfig::new()
        .policy(policy)
        .cost_check(false)
        .local_zerocopy(true);
    let total = 64 * MIB;
    let st = send_verified(Topo::Loopback, config, total, MIB).await;
    assert_eq!(st.tx_bytes(), total as u64);
    // Loopback copies at delivery and says so: after 4 MiB reported COPIED, copy.
    assert_eq!(st.tx_demotions, 1, "{st}");
    assert!(
        st.tx_bytes_zc_copied >= zcnet::Policy::default().demote_after_copied_bytes.unwrap(),
        "{st}"
    );
    let demoted = st.fallback_bytes(FallbackReason::DemotedCopied);
    assert!(demoted > 0, "{st}");
    assert_eq!(
        st.tx_bytes_copy, demoted,
        "every copied byte has its reason: {st}"
    );
    assert_eq!(st.auto_tx.cost_checks, 0, "no check was asked for");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_to_this_host_never_asks_for_zero_copy() {
    // The default (`auto`) on loopback: local delivery copies anyway, so not one byte is
    // sent zero-copy, and every byte is counted under the reason.
    let total = 32 * MIB;
    let st = send_verified(Topo::Loopback, ZcConfig::new(), total, MIB).await;
    assert_eq!(st.tx_bytes_zerocopy, 0, "{st}");
    assert_eq!(
        st.fallback_bytes(FallbackReason::LocalDelivery),
        total as u64,
        "{st}"
    );
    assert_eq!(st.tx_demotions, 0, "{st}");
    assert_eq!(
        st.auto_tx,
        zcnet::auto::AutoStats::default(),
        "no check ran"
    );
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_namespaces_the_default_tries_briefly_then_copies() {
    let veth = veth_pair(9000);
    // Not local: the first try remains, and the COPIED notifications end it.
    let total = 64 * MIB;
    let st = send_verified(Topo::Netns(&veth), ZcConfig::new(), total, MIB).await;
    assert_eq!(st.fallback_bytes(FallbackReason::LocalDelivery), 0, "{st}");
    assert!(st.tx_bytes_zerocopy > 0, "{st}");
    assert!(st.tx_bytes_zerocopy <= total as u64 / 2, "{st}");
    assert_eq!(st.tx_demotions, 1, "{st}");
    assert!(st.fallback_bytes(FallbackReason::DemotedCopied) > 0, "{st}");
    eprintln!("netns default: {st}; {:?}", st.auto_tx);
}

/// Bytes sent by copy because the kernel would not pin them for a zero-copy send: without
/// CAP_IPC_LOCK the pages in flight count against RLIMIT_MEMLOCK, and a send past it is
/// refused with ENOBUFS.
fn refused_bytes(st: &StatsSnapshot) -> u64 {
    st.fallback_bytes(FallbackReason::Enobufs) + st.fallback_bytes(FallbackReason::Memlock)
}

fn check_routes(st: &StatsSnapshot, total: usize, size: usize) {
    assert_eq!(st.tx_bytes(), total as u64);
    let a = st.auto_tx;
    // One comparison at least: 16 MiB zero-copy measured, 16 MiB settling, 16 MiB copy.
    assert!(a.cost_checks >= 1, "{a:?}");
    assert!(a.cost_sample_ops >= (32 * MIB / size) as u64, "{a:?}");
    assert!(a.cost_costlier <= a.cost_checks);
    assert_eq!(
        st.fallback_ops(FallbackReason::Costlier),
        a.fallback_costlier,
        "{st}"
    );
    // Every copied byte went to measure copy, because zero-copy cost more, or because the
    // kernel would not pin it for a zero-copy send (counted).
    assert_eq!(
        st.tx_bytes_copy,
        a.cost_sample_ops * size as u64
            + st.fallback_bytes(FallbackReason::Costlier)
            + refused_bytes(st),
        "{st} {a:?}"
    );
    assert!(st.tx_bytes_zerocopy >= 16 << 20, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_check_routes_between_paths_and_every_byte_arrives_on_loopback() {
    let config = ZcConfig::new().policy(Policy::always()).cost_check(true);
    let total = 80 * MIB;
    let st = send_verified(Topo::Loopback, config, total, MIB).await;
    check_routes(&st, total, MIB);
    eprintln!("loopback: {st}; {:?}", st.auto_tx);
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_check_routes_between_paths_and_every_byte_arrives_across_namespaces() {
    let veth = veth_pair(9000);
    let config = ZcConfig::new().policy(Policy::always()).cost_check(true);
    let total = 64 * MIB;
    let st = send_verified(Topo::Netns(&veth), config, total, 256 << 10).await;
    check_routes(&st, total, 256 << 10);
    eprintln!("netns: {st}; {:?}", st.auto_tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_always_is_not_second_guessed_unless_asked() {
    let config = ZcConfig::new().policy(Policy::always());
    let total = 48 * MIB;
    let st = send_verified(Topo::Loopback, config, total, MIB).await;
    // Every byte zero-copy, but for sends the kernel would not pin (counted) — never a byte
    // copied by a choice of `auto`.
    assert_eq!(
        st.tx_bytes_zerocopy + refused_bytes(&st),
        total as u64,
        "{st}"
    );
    assert_eq!(st.auto_tx, zcnet::auto::AutoStats::default());
}
