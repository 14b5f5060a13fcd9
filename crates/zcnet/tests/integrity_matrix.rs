//! Every transmit path × every receive path × sizes × buffer alignment, over loopback and
//! over a veth pair between two network namespaces at MTU 1500 and 9000. Every byte is
//! verified, and the stats must say the bytes went where the paths claim.

mod common;

use common::{transfer, veth_pair, Case, Topo};
use zcnet::{FallbackReason, RxPath, TxPath};

const SIZES: [u64; 6] = [1, 4095, 4096, 65537, 1 << 20, 64 << 20];

fn run_matrix(topo: Topo<'_>, label: &str) {
    let mut summary = Vec::new();
    for tx in TxPath::ALL {
        for rx in RxPath::ALL {
            for size in SIZES {
                for offset in [0, 1] {
                    let case = Case {
                        tx,
                        rx,
                        size,
                        offset,
                    };
                    eprintln!("case {label} {tx}->{rx} size {size} offset {offset}");
                    let out = transfer(topo, case);
                    let what = format!("{label} {tx}->{rx} size {size} offset {offset}");
                    assert_eq!(out.received, size, "{what}: byte count");
                    assert_eq!(out.tx.tx_bytes(), size, "{what}: sender stats");
                    assert_eq!(out.rx.rx_bytes(), size, "{what}: receiver stats");
                    match tx {
                        TxPath::Zerocopy => {
                            // All zero-copy but for what the kernel would not pin within
                            // the locked-memory limit (copied, counted; none as root).
                            let refused = common::memlock_copied(&out.tx, &what);
                            assert_eq!(
                                out.tx.tx_bytes_zerocopy + refused,
                                size,
                                "{what}: all zero-copy"
                            );
                            assert_eq!(
                                out.tx.tx_completed_calls, out.tx.tx_calls_zerocopy,
                                "{what}: every zero-copy call completed"
                            );
                            assert!(out.tx.tx_notifications >= 1, "{what}: notifications");
                        }
                        TxPath::Copy => {
                            assert_eq!(out.tx.tx_bytes_copy, size, "{what}: all copied");
                            assert_eq!(out.tx.tx_calls_zerocopy, 0, "{what}");
                        }
                        TxPath::Uring => {
                            let refused = common::memlock_copied(&out.tx, &what);
                            assert_eq!(
                                out.tx.tx_bytes_zerocopy + refused,
                                size,
                                "{what}: all by SEND_ZC"
                            );
                            assert_eq!(
                                out.tx.tx_notifications, out.tx.tx_calls_zerocopy,
                                "{what}: one notification per SEND_ZC request"
                            );
                            // The pool is registered, unless the locked-memory limit refused
                            // it (counted; never with CAP_IPC_LOCK): then no request is fixed.
                            let registered = out.tx.tx_uring_register_failures == 0;
                            assert!(
                                registered || !common::has_cap_ipc_lock(),
                                "{what}: registration refused with CAP_IPC_LOCK"
                            );
                            assert_eq!(
                                out.tx.tx_uring_fixed_calls,
                                if registered {
                                    out.tx.tx_calls_zerocopy
                                } else {
                                    0
                                },
                                "{what}: every request from a registered buffer, or none"
                            );
                            // Local delivery (lo, veth into a namespace) copies every skb, and
                            // the usage reports say so (docs/measurements/kernel-findings.md §3).
                            assert_eq!(
                                out.tx.tx_bytes_zc_copied + refused,
                                size,
                                "{what}: IORING_NOTIF_USAGE_ZC_COPIED on every byte sent so"
                            );
                        }
                        TxPath::Cow => {
                            // Loaned buffers take plain MSG_ZEROCOPY on the cow path: the
                            // application gave them up, so nothing is write-protected.
                            let refused = common::memlock_copied(&out.tx, &what);
                            assert_eq!(
                                out.tx.tx_bytes_zerocopy + refused,
                                size,
                                "{what}: all zero-copy"
                            );
                            assert_eq!(
                                out.tx.tx_completed_calls, out.tx.tx_calls_zerocopy,
                                "{what}: every zero-copy call completed"
                            );
                            assert!(out.tx.tx_notifications >= 1, "{what}: notifications");
                            assert_eq!(out.tx.tx_cow_protections, 0, "{what}: loans unprotected");
                            assert_eq!(out.tx.tx_cow_faults, 0, "{what}");
                        }
                        TxPath::Auto => {
                            // No profile (the helpers pin built-in defaults): every loaned
                            // buffer is decided, and the decision is copy, counted.
                            assert_eq!(out.tx.tx_bytes_copy, size, "{what}: all copied");
                            let a = out.tx.auto_tx;
                            assert!(a.decisions >= 1, "{what}: decisions counted");
                            assert_eq!(a.chose_default_no_profile, a.decisions, "{what}");
                            assert_eq!(out.tx.tx_calls_zerocopy, 0, "{what}: never left copy");
                        }
                        _ => unreachable!(),
                    }
                    match rx {
                        RxPath::Copy => assert_eq!(out.rx.rx_bytes_mapped, 0, "{what}"),
                        RxPath::Mmap => {
                            assert!(out.rx.rx_zc_calls >= 1, "{what}: used TCP_ZEROCOPY_RECEIVE");
                            // A zero-copy sender's deferred copy lands in order-0 pages, and
                            // the page-multiple MSS keeps them whole: most bytes map.
                            if tx == TxPath::Zerocopy && size >= 1 << 20 {
                                assert!(
                                    out.rx.rx_mapped_fraction() > 0.5,
                                    "{what}: only {:.1}% mapped",
                                    100.0 * out.rx.rx_mapped_fraction()
                                );
                            }
                        }
                        RxPath::Uring => {
                            assert_eq!(out.rx.rx_bytes_copied, size, "{what}: provided buffers");
                            assert!(out.rx.rx_uring_cqes >= 1, "{what}: multishot completions");
                            assert_eq!(out.rx.rx_zcrx_refusals, 0, "{what}");
                        }
                        RxPath::Zcrx => {
                            // Neither lo nor veth has header split and queue management: the
                            // registration is refused at accept and the receiver takes the
                            // uring path, saying so.
                            assert_eq!(out.rx.rx_zcrx_refusals, 1, "{what}: zcrx refused");
                            assert_eq!(
                                out.rx.fallback_ops(FallbackReason::Unsupported),
                                1,
                                "{what}: counted as unsupported"
                            );
                            // On veth the accepting thread is in the root namespace, where no
                            // interface holds the listener's address.
                            // Without CAP_NET_ADMIN the kernel refuses first, with EPERM.
                            // Without CAP_IPC_LOCK the ring's memory may first be refused
                            // within RLIMIT_MEMLOCK (per user, shared by the tests running
                            // in parallel): ENOMEM.
                            let want = match topo {
                                Topo::Loopback if !cfg!(zcnet_root) => libc::EPERM,
                                Topo::Loopback => libc::EOPNOTSUPP,
                                Topo::Netns(_) => libc::ENODEV,
                            };
                            let errno = out.rx.rx_zcrx_errno;
                            assert!(
                                errno == want as u64
                                    || (errno == libc::ENOMEM as u64
                                        && !common::has_cap_ipc_lock()),
                                "{what}: errno {errno}, want {want}"
                            );
                            assert_eq!(out.rx.rx_bytes_copied, size, "{what}: via uring");
                            assert!(out.rx.rx_uring_cqes >= 1, "{what}: multishot completions");
                        }
                        RxPath::Auto => {
                            // Chosen once per connection: copy without a profile.
                            assert_eq!(out.rx.rx_bytes_mapped, 0, "{what}");
                            assert_eq!(out.rx.auto_rx.decisions, 1, "{what}: one decision");
                            assert_eq!(out.rx.auto_rx.chose_default_no_profile, 1, "{what}");
                        }
                        _ => unreachable!(),
                    }
                    if size == 64 << 20 {
                        summary.push(format!(
                            "{what}: tx zc {:.1}% (copied by kernel {} B), rx mapped {:.1}%",
                            100.0 * out.tx.tx_bytes_zerocopy as f64 / size as f64,
                            out.tx.tx_bytes_zc_copied,
                            100.0 * out.rx.rx_mapped_fraction()
                        ));
                    }
                }
            }
        }
    }
    for line in summary {
        println!("{line}");
    }
}

#[test]
fn matrix_loopback() {
    run_matrix(Topo::Loopback, "lo");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn matrix_netns_mtu_1500() {
    let pair = veth_pair(1500);
    run_matrix(Topo::Netns(&pair), "veth1500");
}

#[cfg_attr(
    not(zcnet_netns),
    ignore = "needs root and iproute2 (network namespaces)"
)]
#[test]
fn matrix_netns_mtu_9000() {
    let pair = veth_pair(9000);
    run_matrix(Topo::Netns(&pair), "veth9000");
}
