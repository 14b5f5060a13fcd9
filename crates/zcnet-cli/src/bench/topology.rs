//! Where a run's two ends live, and the clean-up that goes with it.
//!
//! * `loopback` — both ends in this process's network namespace on 127.0.0.1 (the server
//!   in a thread);
//! * `netns` — two network namespaces joined by a veth pair with a chosen MTU
//!   ([`zcnet_testbed::netns::VethPair`]), the client in `a`, the server in `b`: two "hosts" with a
//!   real link between them, the papers' large-MTU networks on one machine;
//! * `sink` — the same pair with `b` down, so whatever `a` transmits is dropped by the
//!   device as a NIC's driver frees what it has sent: the kernel never copies zero-copy
//!   pages for local delivery, and the transmit-side saving shows. UDP only: TCP cannot
//!   complete a handshake with a peer that is down.
//! * `--client HOST` — a server started elsewhere with `zcnet bench --server`.
//!
//! Namespaces are created for the run and removed after it: by drop guards on success,
//! error and panic, and by the Ctrl-C/SIGTERM handler (which deletes every namespace still
//! registered, then exits) when the user interrupts.

use super::output;
use super::server::{self, ServeOptions};
use super::spec::{describe_spec, BenchError, Progress, RunSpec, Topology, TopologyInfo};
use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use zcnet_bench::protocol::{Proto, DEFAULT_PORT};
use zcnet_bench::report::Run;
use zcnet_testbed::netns::{Side, VethPair};

/// Namespaces that exist now, for the interrupt handler.
static LIVE_NAMESPACES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Held while namespaces are being made (the availability probe's pair and the run's), and
/// taken by the interrupt handler before it looks: `ip netns add` runs as a child process,
/// so a handler that only scanned `/var/run/netns` could miss a namespace whose `ip` was
/// still running and exit, and the namespace appeared after it, left behind for good (seen
/// under load: Ctrl-C while the run's pair was being made, right after the probe's pair).
static CREATING: Mutex<()> = Mutex::new(());

/// Set by the interrupt handler before it deletes anything: from then on the run's own
/// thread may fail (its namespace vanished under it) or finish, and either must leave the
/// exit to the handler, which ends the process with 130 once the namespaces are gone.
static INTERRUPTING: AtomicBool = AtomicBool::new(false);

/// Parks the calling thread for good if the interrupt handler is at work, so that `main`
/// neither reports the error the interrupt caused nor exits before the handler has removed
/// the namespaces; returns at once otherwise.
pub(crate) fn yield_to_interrupt() {
    while INTERRUPTING.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// Installs (once) the handler that removes live namespaces on Ctrl-C, SIGTERM or SIGHUP
/// and exits with status 130. Without it an interrupted `--topology netns` run would leave
/// its namespaces behind: signals do not unwind, so drop guards never run.
pub(crate) fn install_interrupt_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let r = ctrlc::set_handler(|| {
            // The handler runs on a thread of its own (not in signal context), so it may
            // wait for a creation in progress; each is a few bounded `ip` commands.
            INTERRUPTING.store(true, Ordering::SeqCst);
            let _creating = CREATING.lock().unwrap_or_else(PoisonError::into_inner);
            let mut names: Vec<String> = LIVE_NAMESPACES
                .lock()
                .map(|mut v| std::mem::take(&mut *v))
                .unwrap_or_default();
            // A pair still being built (its namespaces exist, its guard does not yet) is
            // found by the process id that zcnet_testbed::netns puts in every name it makes.
            let ours = format!("zc-{}-", std::process::id());
            if let Ok(dir) = std::fs::read_dir("/var/run/netns") {
                for e in dir.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with(&ours) && !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
            for n in &names {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
            let _ = writeln!(
                std::io::stderr(),
                "\nzcnet bench: interrupted{}",
                if names.is_empty() {
                    String::new()
                } else {
                    format!("; removed network namespaces {}", names.join(", "))
                }
            );
            std::process::exit(130);
        });
        if let Err(e) = r {
            let _ = writeln!(
                std::io::stderr(),
                "zcnet bench: cannot install the Ctrl-C handler ({e}); an interrupted run may leave namespaces behind"
            );
        }
    });
}

/// A [`VethPair`] registered with the interrupt handler for as long as it lives.
#[derive(Debug)]
pub(crate) struct NetnsGuard {
    pub pair: VethPair,
}

impl NetnsGuard {
    pub(crate) fn create(mtu: u32) -> Result<NetnsGuard, BenchError> {
        install_interrupt_handler();
        let _creating = CREATING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(why) = zcnet_testbed::netns::available() {
            return Err(BenchError::Usage(format!(
                "this topology needs two network namespaces: {why}"
            )));
        }
        let pair = VethPair::create(mtu)?;
        if let Ok(mut v) = LIVE_NAMESPACES.lock() {
            v.push(pair.name(Side::A).to_string());
            v.push(pair.name(Side::B).to_string());
        }
        Ok(NetnsGuard { pair })
    }

    fn handle(&self, side: Side) -> Result<File, BenchError> {
        let path = format!("/var/run/netns/{}", self.pair.name(side));
        File::open(&path).map_err(|e| BenchError::io_owned(format!("opening {path}"), e))
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        // The pair's own drop deletes the namespaces right after this.
        if let Ok(mut v) = LIVE_NAMESPACES.lock() {
            let (a, b) = (self.pair.name(Side::A), self.pair.name(Side::B));
            v.retain(|n| n != a && n != b);
        }
    }
}

/// A bench server on a thread of this process (optionally inside a namespace), stopped and
/// joined on drop.
#[derive(Debug)]
pub(crate) struct LocalServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<(), BenchError>>>,
}

impl LocalServer {
    pub(crate) fn start(bind: SocketAddr, netns: Option<File>) -> Result<LocalServer, BenchError> {
        let (tx, rx) = mpsc::channel::<Result<SocketAddr, BenchError>>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("zcnet-bench-server".into())
            .spawn(move || -> Result<(), BenchError> {
                let setup = (|| {
                    if let Some(f) = &netns {
                        zcnet_testbed::netns::enter_handle(f.as_fd())
                            .map_err(|e| BenchError::io("setns (server namespace)", e))?;
                    }
                    let l = TcpListener::bind(bind)
                        .map_err(|e| BenchError::io_owned(format!("binding {bind}"), e))?;
                    let a = l
                        .local_addr()
                        .map_err(|e| BenchError::io("getsockname", e))?;
                    Ok((l, a))
                })();
                match setup {
                    Ok((l, a)) => {
                        let _ = tx.send(Ok(a));
                        server::serve(
                            &l,
                            &stop2,
                            ServeOptions {
                                log: false,
                                once: false,
                            },
                        )
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        Ok(())
                    }
                }
            })
            .map_err(|e| BenchError::io("spawning the server thread", e))?;
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| BenchError::Failed("the local bench server did not start".into()))??;
        Ok(LocalServer {
            addr,
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Where runs go: a server (local or remote) or the sink.
#[derive(Debug)]
pub(crate) enum Env {
    /// `--client HOST`.
    Remote { ctrl: SocketAddr },
    /// Both ends here on 127.0.0.1.
    Loopback { server: LocalServer },
    /// Server in namespace `b`, client in `a`. Field order is drop order: the server
    /// thread leaves namespace `b` before the namespaces are deleted.
    Netns {
        server: LocalServer,
        guard: NetnsGuard,
    },
    /// Transmit into `a`'s veth with `b` down.
    Sink { guard: NetnsGuard },
}

/// Resolves `HOST[:PORT]` (default port [`DEFAULT_PORT`]; IPv6 in brackets).
pub(crate) fn resolve(host: &str) -> Result<SocketAddr, BenchError> {
    let with_port = if host.parse::<IpAddr>().is_ok() && host.contains(':') {
        format!("[{host}]:{DEFAULT_PORT}") // bare IPv6
    } else if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_string()
    } else {
        format!("{host}:{DEFAULT_PORT}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| BenchError::Usage(format!("cannot resolve {host:?}: {e}")))?
        .next()
        .ok_or_else(|| BenchError::Usage(format!("{host:?} resolves to no address")))
}

impl Env {
    /// Sets up `topology` (or connects nowhere yet, for `--client`).
    pub(crate) fn open(
        topology: Topology,
        mtu: Option<u32>,
        client: Option<&str>,
    ) -> Result<Env, BenchError> {
        if let Some(host) = client {
            return Ok(Env::Remote {
                ctrl: resolve(host)?,
            });
        }
        match topology {
            Topology::Loopback => Ok(Env::Loopback {
                server: LocalServer::start(
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                    None,
                )?,
            }),
            Topology::Netns => {
                let guard = NetnsGuard::create(mtu.unwrap_or(1500))?;
                let bind = SocketAddr::new(IpAddr::V4(guard.pair.addr(Side::B)), 0);
                let server = LocalServer::start(bind, Some(guard.handle(Side::B)?))?;
                Ok(Env::Netns { server, guard })
            }
            Topology::Sink => {
                let guard = NetnsGuard::create(mtu.unwrap_or(1500))?;
                // VethPair pins the neighbours, so A still transmits once B is down.
                guard.pair.set_link_up(Side::B, false)?;
                Ok(Env::Sink { guard })
            }
        }
    }

    /// What the report calls this topology.
    pub(crate) fn info(&self) -> TopologyInfo {
        match self {
            Env::Remote { ctrl } => TopologyInfo {
                name: if ctrl.ip().is_loopback() {
                    "loopback".into()
                } else {
                    "remote".into()
                },
                mtu: None,
                proto: Proto::Tcp,
            },
            Env::Loopback { .. } => TopologyInfo {
                name: "loopback".into(),
                mtu: None,
                proto: Proto::Tcp,
            },
            Env::Netns { guard, .. } => TopologyInfo {
                name: "netns".into(),
                mtu: Some(guard.pair.mtu()),
                proto: Proto::Tcp,
            },
            Env::Sink { guard } => TopologyInfo {
                name: "sink".into(),
                mtu: Some(guard.pair.mtu()),
                proto: Proto::Tcp,
            },
        }
    }

    /// Whether runs here carry UDP to a sink rather than TCP to a server.
    pub(crate) fn is_sink(&self) -> bool {
        matches!(self, Env::Sink { .. })
    }

    /// Runs one measurement.
    pub(crate) fn run(&self, spec: &RunSpec, progress: &Progress) -> Result<Run, BenchError> {
        match self {
            Env::Remote { ctrl } => super::client::run(*ctrl, spec, progress),
            Env::Loopback { server } => super::client::run(server.addr, spec, progress),
            Env::Netns { server, guard } => guard
                .pair
                .run_in(Side::A, || super::client::run(server.addr, spec, progress))?,
            Env::Sink { guard } => {
                let pair = &guard.pair;
                match spec.topology.proto {
                    Proto::Tcp => {
                        pair.run_in(Side::A, || super::sink::run(pair, spec, progress))?
                    }
                    Proto::Udp => {
                        pair.run_in(Side::A, || super::udp::sink_run(pair, spec, progress))?
                    }
                }
            }
        }
    }
}

/// Runs `specs` in order. A path pair found unsupported on this host (every operation fell
/// back with reason `unsupported`) is run once, marked, and skipped afterwards. Any failure
/// stops everything with the run named.
pub(crate) fn execute(
    env: &Env,
    specs: &[RunSpec],
    show_progress: bool,
) -> Result<Vec<Run>, BenchError> {
    let mut runs = Vec::new();
    let mut unsupported: HashSet<(String, String)> = HashSet::new();
    output::with_progress(show_progress, specs.len(), |ui| {
        for (i, spec) in specs.iter().enumerate() {
            let p = &spec.params;
            let pair = (p.tx.clone(), p.rx.clone());
            if unsupported.contains(&pair) {
                continue;
            }
            ui.begin(i, &describe_spec(spec));
            let run = env.run(spec, &ui.progress).map_err(|e| {
                BenchError::Failed(format!("run {} failed: {e}", describe_spec(spec)))
            })?;
            if run.unsupported() {
                unsupported.insert(pair);
            }
            runs.push(run);
        }
        Ok(runs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(
            resolve("127.0.0.1").unwrap(),
            format!("127.0.0.1:{DEFAULT_PORT}").parse().unwrap()
        );
        assert_eq!(
            resolve("127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            resolve("::1").unwrap(),
            format!("[::1]:{DEFAULT_PORT}").parse().unwrap()
        );
        assert_eq!(resolve("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        assert!(resolve("no such host.invalid").is_err());
    }
}
