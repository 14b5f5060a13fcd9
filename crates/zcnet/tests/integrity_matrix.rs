//! Every transmit path × every receive path × sizes × buffer alignment, over loopback and
//! over a veth pair between two network namespaces at MTU 1500 and 9000. Every byte is
//! verified, and the stats must say the bytes went where the paths claim.

mod common;

use common::{transfer, veth_or_skip, Case, Topo};
use zcnet::{RxPath, TxPath};

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
                            assert_eq!(out.tx.tx_bytes_zerocopy, size, "{what}: all zero-copy");
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

#[test]
fn matrix_netns_mtu_1500() {
    let Some(pair) = veth_or_skip(1500) else {
        return;
    };
    run_matrix(Topo::Netns(&pair), "veth1500");
}

#[test]
fn matrix_netns_mtu_9000() {
    let Some(pair) = veth_or_skip(9000) else {
        return;
    };
    run_matrix(Topo::Netns(&pair), "veth9000");
}
