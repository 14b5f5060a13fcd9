//! The data plane of one run: the loops each data connection's thread executes. Each loop
//! measures its own thread's CPU (`getrusage(RUSAGE_THREAD)`) around the transfer only —
//! connection set-up and buffer-pool allocation are outside — and times every `send()` and
//! `recv()` call into a latency histogram.
//!
//! * stream: the client sends (`Sender::send` of a loaned, pooled buffer; `send_slice` from
//!   the application's own ring for the `cow` path, which keeps copy semantics), the server
//!   receives (`Receiver::recv`) until end of stream;
//! * rr: NetPIPE's ping-pong — the client sends `size` bytes and waits for `size` bytes
//!   back, the server echoes; both ends use both paths on one socket (`TCP_NODELAY`).

use super::control::{cpu_now, side_cpu, Cancel, WorkerOut, DATA_TIMEOUT};
use super::files::{self, Cursor, SinkFile, SourceFile};
use super::spec::{BenchError, Progress};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Instant;
use zcnet::stream::{Listener, Receiver};
use zcnet::{Policy, Pool, ReceiverConfig, RxPath, Sender, SenderConfig, TxPath};
use zcnet_bench::histogram::LatencyHistogram;
use zcnet_bench::protocol::Params;
use zcnet_bench::report::SideStats;
use zcnet_bench::touch;

/// Parses a path name this build knows.
pub(crate) fn tx_path(name: &str) -> Result<TxPath, BenchError> {
    name.parse()
        .map_err(|e: zcnet::UnknownName| BenchError::Usage(e.to_string()))
}

/// Parses a path name this build knows.
pub(crate) fn rx_path(name: &str) -> Result<RxPath, BenchError> {
    name.parse()
        .map_err(|e: zcnet::UnknownName| BenchError::Usage(e.to_string()))
}

/// The `cow` path keeps copy semantics for `&[u8]` callers (pages write-protected while in
/// flight), so the application sends from its own ring with `send_slice`; every other path
/// lends pooled buffers with `send`. Matched by name so this compiles whether or not this
/// build has the path.
pub(crate) fn uses_slice_api(tx: TxPath) -> bool {
    tx.name() == "cow"
}

fn sender_config(p: &Params, tx: TxPath, nodelay: bool) -> SenderConfig {
    let mut cfg = SenderConfig::new(tx);
    // Measure the path itself: no size threshold, no demotion after COPIED completions
    // (the policy's job is deciding; the bench's is showing what each path costs).
    cfg.policy = Policy::always();
    cfg.buf_bytes = p.size as usize;
    cfg.pool_buffers = if uses_slice_api(tx) {
        1
    } else {
        p.ring as usize
    };
    cfg.timeout = Some(DATA_TIMEOUT);
    cfg.nodelay = nodelay;
    // `auto` looks up the profile's variant for what this run's application does.
    cfg.touch = p.touch;
    crate::library_opts::sender(cfg)
}

/// Receive configuration for a run's receive path. `file` splices the socket into a file
/// (`Receiver::recv_to_file`), which does not read through a receive path: the receiver
/// is set up on `copy`, which only ever carries bytes read before the splice.
pub(crate) fn receiver_config(p: &Params) -> Result<ReceiverConfig, BenchError> {
    let path = if p.rx == files::FILE {
        RxPath::Copy
    } else {
        rx_path(&p.rx)?
    };
    let mut cfg = ReceiverConfig::new(path);
    cfg.timeout = Some(DATA_TIMEOUT);
    cfg.touch = p.touch;
    cfg.op_size = p.size as usize;
    // Read as much per call as the sender writes, never less than the default (iperf3's
    // `-l` sets both ends' block): at 1 MiB a 256 KiB read buffer took four `recv` calls —
    // and as many wake-ups of the sender — per write where iperf3 takes one. The mapping
    // (and the uring path's ring of provided buffers) grows with it: 16 reads' worth, up to
    // 1 MiB reads. `--read-size` (netperf's `-M`) sets it outright.
    cfg.buf_bytes = match p.read {
        Some(r) => r as usize,
        None => cfg.buf_bytes.max(p.size as usize),
    };
    cfg.map_bytes = cfg.map_bytes.max(16 * cfg.buf_bytes.min(1 << 20));
    Ok(crate::library_opts::receiver(cfg))
}

fn zerr(context: &'static str) -> impl Fn(zcnet::Error) -> BenchError {
    move |source| BenchError::Zcnet { context, source }
}

/// The application's own ring for the slice API: page-aligned memory from a private pool,
/// kept for the whole run (buffers are reused round-robin, as the Solaris ttcp's nine
/// circular 16 KB buffers were).
fn app_ring(p: &Params) -> Result<Vec<zcnet::TxBuf>, BenchError> {
    let pool = Pool::new(p.ring as usize, p.size as usize)
        .map_err(|e| BenchError::io("mmap (application ring)", e))?;
    let mut v = Vec::with_capacity(p.ring as usize);
    while let Some(mut b) = pool.try_take() {
        b.set_len(p.size as usize);
        v.push(b);
    }
    Ok(v)
}

/// One stream connection of the client: sends `quota` bytes, or until `deadline`.
/// `src` is the page-cache file of `--tx file` ([`files::source`]), made before the run's
/// clock started.
pub(crate) fn stream_send(
    addr: SocketAddr,
    p: &Params,
    quota: Option<u64>,
    deadline: Option<Instant>,
    progress: &Progress,
    src: Option<&SourceFile>,
) -> Result<WorkerOut, BenchError> {
    if let (Some(src), Some(mode)) = (src, files::file_tx_mode(&p.tx)) {
        return stream_send_file(addr, p, src, mode, quota, deadline, progress);
    }
    let tx = tx_path(&p.tx)?;
    let mut sender =
        Sender::connect(addr, &sender_config(p, tx, false)).map_err(zerr("connect (data)"))?;
    let mut ring = if uses_slice_api(tx) {
        app_ring(p)?
    } else {
        Vec::new()
    };
    let size = p.size;
    let mut out = WorkerOut::default();
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut sent = 0u64;
    let mut seq = 0u64;
    loop {
        let n = match (quota, deadline) {
            (Some(q), _) if sent >= q => break,
            (Some(q), _) => size.min(q - sent) as usize,
            (None, Some(d)) if Instant::now() >= d => break,
            _ => size as usize,
        };
        seq += 1;
        if ring.is_empty() {
            let mut b = sender
                .buffer()
                .map_err(zerr("waiting for a transmit buffer"))?;
            if p.touch {
                touch::write_words(&mut b.storage_mut()[..n], seq);
            }
            b.set_len(n);
            let t = Instant::now();
            sender.send(b).map_err(zerr("send"))?;
            out.send.record(t.elapsed());
        } else {
            let i = (seq as usize) % ring.len();
            let b = &mut ring[i];
            if p.touch {
                touch::write_words(&mut b.storage_mut()[..n], seq);
            }
            let t = Instant::now();
            sender.send_slice(&b[..n]).map_err(zerr("send"))?;
            out.send.record(t.elapsed());
        }
        sent += n as u64;
        progress.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    let snap = sender.finish().map_err(zerr("finishing the stream"))?;
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_sent = sent;
    out.stats = SideStats::from(&snap);
    drop(ring);
    Ok(out)
}

/// `--tx file`: sends `size` bytes at a time from a page-cache file (`Sender::send_file`,
/// sendfile(2)); `--tx read_send` the same file by `pread` + `send`. The file and `--cold`
/// are [`files`]'. The sender's transmit path is not
/// used: file bytes never pass through user space.
fn stream_send_file(
    addr: SocketAddr,
    p: &Params,
    src: &SourceFile,
    mode: zcnet::FileTxMode,
    quota: Option<u64>,
    deadline: Option<Instant>,
    progress: &Progress,
) -> Result<WorkerOut, BenchError> {
    let mut cfg = sender_config(p, TxPath::Copy, false);
    cfg.pool_buffers = 1;
    let mut sender = Sender::connect(addr, &cfg).map_err(zerr("connect (data)"))?;
    let mut cursor = Cursor::default();
    let mut out = WorkerOut::default();
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut sent = 0u64;
    loop {
        let n = match (quota, deadline) {
            (Some(q), _) if sent >= q => break,
            (Some(q), _) => p.size.min(q - sent),
            (None, Some(d)) if Instant::now() >= d => break,
            _ => p.size,
        };
        let at = cursor.next(src, n)?;
        let t = Instant::now();
        sender
            .send_file_with(&src.file, at, n, mode)
            .map_err(zerr("sendfile"))?;
        out.send.record(t.elapsed());
        sent += n;
        progress.bytes.fetch_add(n, Ordering::Relaxed);
    }
    let snap = sender.finish().map_err(zerr("finishing the stream"))?;
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_sent = sent;
    out.stats = SideStats::from(&snap);
    Ok(out)
}

/// `--rx file`: splices `size` bytes at a time into a file (`Receiver::recv_to_file`)
/// until end of stream. With `--touch` the application then reads every word of what it
/// stored, as it must to look at a received file: `pread` back from the page cache into
/// one buffer (the data never passed through the application on the way in).
fn stream_receive_file(
    mut rx: Receiver,
    p: &Params,
    progress: &Progress,
) -> Result<WorkerOut, BenchError> {
    let mut sink = SinkFile::create(p.size)?;
    let mut out = WorkerOut {
        rx_path: Some(files::FILE.to_string()),
        ..Default::default()
    };
    let mut scratch = if p.touch {
        vec![0u8; p.size as usize]
    } else {
        Vec::new()
    };
    let mut acc = 0u64;
    let mut touch = |file: &std::fs::File, at: u64, n: u64| -> Result<(), BenchError> {
        if p.touch && n > 0 {
            use std::os::unix::fs::FileExt as _;
            let b = &mut scratch[..n as usize];
            file.read_exact_at(b, at)
                .map_err(|e| BenchError::io("pread (touching the received file)", e))?;
            acc ^= touch::read_words(b);
        }
        Ok(())
    };
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut got = 0u64;
    loop {
        let at = sink.next(p.size);
        let t = Instant::now();
        let n = match rx.recv_to_file(&sink.file, at, p.size) {
            Ok(n) => n,
            // The stream ended inside this piece: what arrived is counted, and ends the run.
            Err(zcnet::Error::Truncated { got: n, .. }) => {
                touch(&sink.file, at, n)?;
                got += n;
                progress.bytes.fetch_add(n, Ordering::Relaxed);
                break;
            }
            Err(e) => return Err(zerr("splice (receive into a file)")(e)),
        };
        out.recv.record(t.elapsed());
        touch(&sink.file, at, n)?;
        got += n;
        progress.bytes.fetch_add(n, Ordering::Relaxed);
    }
    std::hint::black_box(acc);
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_received = got;
    out.stats = SideStats::from(&rx.stats().snapshot());
    Ok(out)
}

/// One stream connection of the server: receives until end of stream.
pub(crate) fn stream_receive(
    listener: &Listener,
    p: &Params,
    progress: &Progress,
    cancel: &Cancel,
) -> Result<WorkerOut, BenchError> {
    let rx = listener.accept().map_err(zerr("accept (data)"))?;
    cancel.watch(std::os::fd::AsFd::as_fd(&rx));
    if p.rx == files::FILE {
        return stream_receive_file(rx, p, progress);
    }
    let mut rx = rx;
    let mut out = WorkerOut {
        rx_path: Some(rx.path().name().to_string()),
        ..Default::default()
    };
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut got = 0u64;
    let mut acc = 0u64;
    loop {
        let t = Instant::now();
        match rx.recv().map_err(zerr("recv"))? {
            None => break,
            Some(chunk) => {
                out.recv.record(t.elapsed());
                if p.touch {
                    acc ^= touch::read_words(&chunk);
                }
                got += chunk.len() as u64;
                progress
                    .bytes
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }
    }
    std::hint::black_box(acc);
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.bytes_received = got;
    out.stats = SideStats::from(&rx.stats().snapshot());
    Ok(out)
}

fn dup_stream(fd: std::os::fd::BorrowedFd<'_>) -> Result<TcpStream, BenchError> {
    fd.try_clone_to_owned()
        .map(TcpStream::from)
        .map_err(|e| BenchError::io("dup (socket)", e))
}

/// Receives exactly `size` bytes (one message of a ping-pong); `Ok(false)` on a clean end of
/// stream before the first byte.
fn recv_message(
    rx: &mut Receiver,
    size: u64,
    touch_data: bool,
    hist: &mut LatencyHistogram,
    acc: &mut u64,
) -> Result<bool, BenchError> {
    let mut got = 0u64;
    while got < size {
        let t = Instant::now();
        match rx.recv().map_err(zerr("recv"))? {
            None if got == 0 => return Ok(false),
            None => {
                return Err(BenchError::Failed(format!(
                    "the peer closed the data connection after {got} of {size} bytes of a message"
                )))
            }
            Some(chunk) => {
                hist.record(t.elapsed());
                if touch_data {
                    *acc ^= touch::read_words(&chunk);
                }
                got += chunk.len() as u64;
            }
        }
    }
    if got > size {
        return Err(BenchError::Failed(format!(
            "received {got} bytes where a {size}-byte message was due: the peer does not wait for answers"
        )));
    }
    Ok(true)
}

fn send_message(
    sender: &mut Sender,
    size: u64,
    touch_data: bool,
    seq: u64,
    hist: &mut LatencyHistogram,
) -> Result<(), BenchError> {
    let mut left = size;
    while left > 0 {
        let mut b = sender
            .buffer()
            .map_err(zerr("waiting for a transmit buffer"))?;
        let n = (b.capacity() as u64).min(left) as usize;
        if touch_data {
            touch::write_words(&mut b.storage_mut()[..n], seq);
        }
        b.set_len(n);
        let t = Instant::now();
        sender.send(b).map_err(zerr("send"))?;
        hist.record(t.elapsed());
        left -= n as u64;
    }
    Ok(())
}

/// One ping-pong connection of the client: `trips` round trips, or until `deadline`.
pub(crate) fn rr_client(
    addr: SocketAddr,
    p: &Params,
    trips: Option<u64>,
    deadline: Option<Instant>,
    progress: &Progress,
) -> Result<WorkerOut, BenchError> {
    let tx = tx_path(&p.tx)?;
    let mut sender =
        Sender::connect(addr, &sender_config(p, tx, true)).map_err(zerr("connect (data)"))?;
    let mut rx = Receiver::from_stream(dup_stream(sender.socket())?, &receiver_config(p)?)
        .map_err(zerr("receiver set-up"))?;
    let mut out = WorkerOut {
        rx_path: Some(rx.path().name().to_string()),
        ..Default::default()
    };
    let mut acc = 0u64;
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut n = 0u64;
    loop {
        match (trips, deadline) {
            (Some(t), _) if n >= t => break,
            (None, Some(d)) if Instant::now() >= d => break,
            _ => {}
        }
        n += 1;
        let t = Instant::now();
        send_message(&mut sender, p.size, p.touch, n, &mut out.send)?;
        if !recv_message(&mut rx, p.size, p.touch, &mut out.recv, &mut acc)? {
            return Err(BenchError::Failed(
                "the server closed the data connection instead of answering".into(),
            ));
        }
        out.rtt.record(t.elapsed());
        out.bytes_sent += p.size;
        out.bytes_received += p.size;
        progress.bytes.fetch_add(2 * p.size, Ordering::Relaxed);
    }
    let snap = sender.finish().map_err(zerr("finishing the stream"))?;
    // The server answers our end of stream with its own.
    if recv_message(&mut rx, 1, false, &mut out.recv, &mut acc)? {
        return Err(BenchError::Failed(
            "the server sent data after the last round trip".into(),
        ));
    }
    std::hint::black_box(acc);
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.stats = SideStats::from(&snap);
    out.stats.merge(&SideStats::from(&rx.stats().snapshot()));
    Ok(out)
}

/// One ping-pong connection of the server: echoes `size`-byte messages until end of stream.
pub(crate) fn rr_server(
    listener: &Listener,
    p: &Params,
    progress: &Progress,
    cancel: &Cancel,
) -> Result<WorkerOut, BenchError> {
    let tx = tx_path(&p.tx)?;
    let mut rx = listener.accept().map_err(zerr("accept (data)"))?;
    cancel.watch(std::os::fd::AsFd::as_fd(&rx));
    let mut sender = Sender::from_stream(dup_stream(rx.socket())?, &sender_config(p, tx, true))
        .map_err(zerr("sender set-up"))?;
    let mut out = WorkerOut {
        rx_path: Some(rx.path().name().to_string()),
        ..Default::default()
    };
    let mut acc = 0u64;
    let t0 = cpu_now()?;
    out.started = Some(Instant::now());
    let mut seq = 0u64;
    while recv_message(&mut rx, p.size, p.touch, &mut out.recv, &mut acc)? {
        seq += 1;
        out.bytes_received += p.size;
        send_message(&mut sender, p.size, p.touch, seq, &mut out.send)?;
        out.bytes_sent += p.size;
        progress.bytes.fetch_add(2 * p.size, Ordering::Relaxed);
    }
    let snap = sender.finish().map_err(zerr("finishing the stream"))?;
    std::hint::black_box(acc);
    out.ended = Some(Instant::now());
    out.cpu = side_cpu(t0, cpu_now()?);
    out.stats = SideStats::from(&rx.stats().snapshot());
    out.stats.merge(&SideStats::from(&snap));
    Ok(out)
}
