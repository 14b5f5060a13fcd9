//! `zcnet bench --server` cannot be denied to everyone by one client: a client that stalls
//! or trickles its hello does not hold the server; a client that comes during a run is told
//! "busy" at once (and never runs later as a ghost); a client that vanishes after its hello
//! releases the run at once. Runs are tiny; nothing here asserts on speed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use zcnet_bench::protocol::{self, Message};

mod common;
use common::{run_bounded, zcnet, Server};

fn params() -> protocol::Params {
    protocol::Params {
        mode: zcnet_bench::report::Mode::Stream,
        tx: "copy".into(),
        rx: "copy".into(),
        size: 4096,
        streams: 1,
        ring: 8,
        touch: false,
        limit: protocol::Limit::Bytes(1 << 20),
        read: None,
    }
}

fn real_run(addr: &str) -> std::process::Output {
    run_bounded(
        zcnet().args([
            "bench", "--client", addr, "--tx", "copy", "--rx", "copy", "--size", "64K", "--bytes",
            "4M", "--repeat", "1", "--json",
        ]),
        Duration::from_secs(60),
    )
}

#[test]
fn stalled_and_trickling_hellos_do_not_hold_the_server() {
    let server = Server::start(&[]);
    let mut silent = TcpStream::connect(&server.addr).unwrap();
    let trickler = TcpStream::connect(&server.addr).unwrap();
    let t = std::thread::spawn(move || {
        // A byte of the frame length every 500 ms: each read is far inside any per-read
        // timeout, but the hello never completes.
        let mut s = trickler;
        for _ in 0..4 {
            if s.write_all(&[0]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        s
    });
    let out = real_run(&server.addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The silent client is let go at the hello deadline (3 s), with or without a reason:
    // its read ends (end of stream or a reset), where a client still held would see its
    // own 20 s read timeout run out.
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut b = Vec::new();
    if let Err(e) = silent.read_to_end(&mut b) {
        assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the silent client was never let go"
        );
    }
    drop(t.join().unwrap());
}

#[test]
fn a_client_during_a_run_is_told_busy_and_a_vanished_client_releases_the_run() {
    let server = Server::start(&[]);
    // Client A: a valid hello, accepted; then it never opens its data connection.
    let mut a = TcpStream::connect(&server.addr).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    protocol::write_message(&mut a, &Message::Hello { params: params() }).unwrap();
    assert!(matches!(
        protocol::read_message(&mut a),
        Ok(Message::Accept { .. })
    ));
    // Client B meanwhile: told at once, with the reason.
    let mut b = TcpStream::connect(&server.addr).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Told, not queued: A's run never ends, so a B left waiting would hit its read timeout.
    protocol::write_message(&mut b, &Message::Hello { params: params() }).unwrap();
    match protocol::read_message(&mut b) {
        Ok(Message::Reject { reason }) => assert!(reason.contains("busy"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // The real client's error names the cause.
    let out = real_run(&server.addr);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A vanishes: the run is released at once and a real client gets through.
    drop(a);
    std::thread::sleep(Duration::from_millis(300));
    let out = real_run(&server.addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(b);
}

/// Five clients in a row, each with a valid hello that is accepted and then gone before
/// opening a data connection (the run left waiting for its data): each departure stops its
/// run at once — its threads end, where they used to wait out the 20 s data timeout and,
/// four of them, made the server answer everyone "busy" — so the sixth client, a real
/// one, runs at once.
#[test]
fn abandoned_runs_are_stopped_at_once_and_never_make_the_server_busy() {
    let server = Server::start(&[]);
    let pid = server.pid();
    let idle_threads = common::procfs::threads(pid);
    for i in 0..5 {
        let mut a = TcpStream::connect(&server.addr).unwrap();
        a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        protocol::write_message(&mut a, &Message::Hello { params: params() }).unwrap();
        match protocol::read_message(&mut a) {
            Ok(Message::Accept { .. }) => {}
            other => panic!("hello {i} after {i} abandoned runs: {other:?}"),
        }
        drop(a);
        // The server looks for departed clients every 100 ms at most.
        std::thread::sleep(Duration::from_millis(300));
    }
    // Every abandoned run's thread has ended: back to the idle server's threads.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while common::procfs::threads(pid) > idle_threads {
        assert!(
            std::time::Instant::now() < deadline,
            "{} threads, {idle_threads} when idle: abandoned runs still hold theirs",
            common::procfs::threads(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = real_run(&server.addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// At its descriptor limit (`prlimit --nofile` on the running server), with clients waiting
/// in the backlog, the accept loop waits instead of spinning and logs a line a second at
/// most; once descriptors come back, a real client runs.
#[cfg_attr(
    not(zcnet_has_prlimit),
    ignore = "needs prlimit (apt-get install util-linux)"
)]
#[test]
fn at_the_descriptor_limit_the_server_backs_off_and_recovers() {
    let mut server = Server::start(&[]);
    let pid = server.pid();
    let open = common::procfs::descriptors(pid);
    assert!(
        common::procfs::set_limit(pid, "nofile", Some(open + 2)),
        "prlimit sets the server's descriptor limit"
    );
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let l = log.clone();
    let mut err = std::io::BufReader::new(server.take_stderr());
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut err, &mut line).unwrap_or(0) > 0 {
            l.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    let silent: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let lines0 = log.lock().unwrap().lines().count();
    std::thread::sleep(Duration::from_secs(2));
    let text = log.lock().unwrap().clone();
    let window: Vec<&str> = text.lines().skip(lines0).collect();
    let failed = common::accept_failures(&window);
    eprintln!(
        "at the descriptor limit for 2 s: {failed} failed accepts reported in {} log lines",
        window.len()
    );
    assert!(
        text.contains("Too many open files"),
        "EMFILE was hit: {text}"
    );
    assert!(window.len() <= 4, "{} lines in 2 s: {text}", window.len());
    assert!(
        failed <= common::BACKED_OFF_FAILURES,
        "{failed} failed accepts in 2 s: spinning on EMFILE\n{text}"
    );
    drop(silent);
    assert!(common::procfs::set_limit(pid, "nofile", Some(1024)));
    std::thread::sleep(Duration::from_millis(1200));
    let out = real_run(&server.addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
