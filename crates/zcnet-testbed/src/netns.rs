//! Two-host topologies built from real Linux network namespaces, for integration tests and
//! `zcnet bench --topology netns`.
//!
//! A [`VethPair`] is two fresh network namespaces joined by a veth cable:
//!
//! ```text
//!   namespace zc-<pid>-<n>-<salt>-a          namespace zc-<pid>-<n>-<salt>-b
//!   lo (up)  vza 10.77.0.1/24  <== veth ==>  vzb 10.77.0.2/24  lo (up)
//! ```
//!
//! Why namespaces rather than loopback: a veth pair is a real `net_device` with its own MTU
//! (up to 65535, so segmentation and `TCP_ZEROCOPY_RECEIVE`'s page alignment can be tested at
//! 1500 and 9000), its own qdisc and drop counters, and an administrative state that can be
//! turned off, all on one machine and without touching the host's configuration.
//!
//! What it does not give: transmit zero-copy all the way to the peer. Any skb that is
//! delivered to a local socket (over `lo` *or* veth) has its user pages copied before
//! delivery, and the `MSG_ZEROCOPY` completion then carries `SO_EE_CODE_ZEROCOPY_COPIED`
//! (kernel `Documentation/networking/msg_zerocopy.rst`, "Loopback"). With side `b` down
//! ([`VethPair::set_link_up`]) packets from `a` are dropped on `a`'s side instead of being
//! delivered, so their pages should be released without that copy: the transmit-only "sink"
//! topology (its tests, not this module's, check the completion codes).
//!
//! Why the veth ends are created *inside* the namespaces (`ip link add vza netns A type veth
//! peer name vzb netns B`): the kernel then creates each device directly in its namespace, so
//! the fixed names `vza`/`vzb` never meet in the root namespace and any number of pairs (for
//! parallel tests, or parallel test processes) can exist at once. The addresses
//! `10.77.0.0/24` are likewise private to the namespaces and cannot clash with the host's.
//!
//! Everything is driven by `ip` (iproute2) and must run as root (`CAP_SYS_ADMIN` and
//! `CAP_NET_ADMIN`); [`available`] says whether this host can, so tests can skip visibly.
//!
//! Namespace membership is per *thread* (`setns(2)`): [`VethPair::enter_a`] moves only the
//! calling thread, and [`VethPair::run_in_a`] runs a closure on a short-lived thread that
//! does so. A socket remembers the namespace it was created in, so a socket made inside `a`
//! can then be used from any thread.

use std::fmt;
use std::fs::File;
use std::io::{self, Write as _};
use std::net::Ipv4Addr;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where `ip netns add` bind-mounts namespace handles (iproute2's `NETNS_RUN_DIR`; `/var/run`
/// is a symlink to `/run` on every current distribution).
const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Interface name of the veth end in namespace `a` (≤ 15 bytes, `IFNAMSIZ - 1`).
const IFNAME_A: &str = "vza";
/// Interface name of the veth end in namespace `b`.
const IFNAME_B: &str = "vzb";
/// Address of side `a`; the `/24` is private to the pair's namespaces.
const ADDR_A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// Address of side `b`.
const ADDR_B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// Prefix length of both addresses.
const PREFIX_LEN: u8 = 24;

/// Failure to build, enter or configure a namespace topology.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// A command could not be started at all (most often: `ip` is not installed).
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command line, as it would be typed into a shell.
        command: String,
        /// Why `exec` failed.
        #[source]
        source: io::Error,
    },
    /// A command ran and failed; `stderr` holds what it said (for `ip`, usually the
    /// kernel's netlink error message).
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, as it would be typed into a shell.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The namespace handle under `/var/run/netns` could not be opened.
    #[error("could not open network namespace handle {}: {source}", path.display())]
    Open {
        /// The handle's path.
        path: PathBuf,
        /// Why `open` failed.
        #[source]
        source: io::Error,
    },
    /// `setns(2)` refused to move the thread into the namespace.
    #[error("could not enter network namespace {namespace}: {source}")]
    Enter {
        /// The namespace's name.
        namespace: String,
        /// The error from `setns`.
        #[source]
        source: io::Error,
    },
    /// The helper thread for [`VethPair::run_in_a`] could not be spawned.
    #[error("could not spawn a thread to run in network namespace {namespace}: {source}")]
    Thread {
        /// The namespace's name.
        namespace: String,
        /// The error from `std::thread::Builder::spawn_scoped`.
        #[source]
        source: io::Error,
    },
    /// A sysctl key was empty or would escape `/proc/sys`.
    #[error("invalid sysctl key {key:?}")]
    InvalidSysctlKey {
        /// The key as given.
        key: String,
    },
    /// Reading or writing a sysctl failed. `NotFound` means the key does not exist in a
    /// non-initial namespace on this kernel (it is not per-namespace there).
    #[error("sysctl {key} in network namespace {namespace}: {source}")]
    Sysctl {
        /// The namespace's name.
        namespace: String,
        /// The key as given.
        key: String,
        /// The error from the `/proc/sys` file.
        #[source]
        source: io::Error,
    },
}

/// One of the two ends of a [`VethPair`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// Namespace `a`, interface `vza`, address `10.77.0.1`.
    A,
    /// Namespace `b`, interface `vzb`, address `10.77.0.2`.
    B,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::A => "a",
            Side::B => "b",
        })
    }
}

/// Two fresh network namespaces joined by a veth pair; both are deleted on drop.
///
/// Dropping deletes the namespaces with `ip netns del`, which also removes the veth pair. The
/// kernel frees a namespace only when nothing refers to it any more, so sockets that outlive
/// the `VethPair` keep their (now nameless) namespace alive until they are closed. Drop never
/// panics, so it also cleans up when a test fails and unwinds; only a killed process leaks its
/// namespaces (their names start with `zc-<pid>-`).
#[derive(Debug)]
pub struct VethPair {
    // Declaration order is drop order: `a` is deleted first, then `b`.
    a: Namespace,
    b: Namespace,
    mtu: u32,
}

impl VethPair {
    /// Creates the two namespaces and the veth pair between them with `mtu` on both ends,
    /// brings `lo` and both ends up, and assigns `10.77.0.1/24` (a) and `10.77.0.2/24` (b).
    ///
    /// Names are unique per process (pid and a counter) and salted with the clock, so parallel
    /// tests and parallel test processes never collide. On failure, whatever was already
    /// created is deleted again. veth accepts MTUs from 68 to 65535; the kernel's message for
    /// anything else ends up in [`NetnsError::Command`].
    pub fn create(mtu: u32) -> Result<VethPair, NetnsError> {
        let stem = unique_stem();
        let a = Namespace::add(format!("{stem}-a"))?;
        let b = Namespace::add(format!("{stem}-b"))?;
        let pair = VethPair { a, b, mtu };

        let mtu = mtu.to_string();
        run_ip(&[
            "link",
            "add",
            IFNAME_A,
            "mtu",
            &mtu,
            "netns",
            &pair.a.name,
            "type",
            "veth",
            "peer",
            "name",
            IFNAME_B,
            "mtu",
            &mtu,
            "netns",
            &pair.b.name,
        ])?;
        for side in [Side::A, Side::B] {
            let ns = pair.namespace(side).name.as_str();
            let ifname = pair.ifname(side);
            let cidr = format!("{}/{PREFIX_LEN}", pair.addr(side));
            run_ip(&["-n", ns, "link", "set", "lo", "up"])?;
            run_ip(&["-n", ns, "addr", "add", &cidr, "dev", ifname])?;
            run_ip(&["-n", ns, "link", "set", ifname, "up"])?;
        }
        // Permanent neighbour entries both ways: the first packets of a test would otherwise
        // wait in the ARP queue (`unres_qlen`), which drops a burst — seen as lost UDP
        // messages when a test's first GSO burst met an unresolved neighbour. It also lets a
        // side transmit while its peer is down (the bench's sink).
        for side in [Side::A, Side::B] {
            let peer = side.peer();
            let mac = pair.mac(peer)?;
            run_ip(&[
                "-n",
                pair.name(side),
                "neigh",
                "replace",
                &pair.addr(peer).to_string(),
                "lladdr",
                &mac,
                "dev",
                pair.ifname(side),
                "nud",
                "permanent",
            ])?;
        }
        Ok(pair)
    }

    /// The MAC address of a side's veth interface.
    pub fn mac(&self, side: Side) -> Result<String, NetnsError> {
        let args = [
            "-n",
            self.name(side),
            "-o",
            "link",
            "show",
            self.ifname(side),
        ];
        let text = run_ip(&args)?;
        text.split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .map(str::to_owned)
            .ok_or_else(|| NetnsError::Command {
                command: format!("ip {}", args.join(" ")),
                status: ExitStatus::default(),
                stderr: format!("no link/ether address in: {}", text.trim()),
            })
    }

    /// The MTU both veth ends were created with.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Name of a side's namespace, as `ip netns list` shows it (usable with `ip -n`).
    pub fn name(&self, side: Side) -> &str {
        &self.namespace(side).name
    }

    /// Name of a side's veth interface inside its namespace.
    pub fn ifname(&self, side: Side) -> &'static str {
        Self::ifname_of(side)
    }

    /// Name of a side's veth interface inside its namespace — the same for every pair, since
    /// each lives in a namespace of its own; a profile measured on one pair therefore keys
    /// the interfaces of the next (`zcnet tune --topology netns`).
    pub fn ifname_of(side: Side) -> &'static str {
        match side {
            Side::A => IFNAME_A,
            Side::B => IFNAME_B,
        }
    }

    /// Address of a side's veth interface.
    pub fn addr(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::A => ADDR_A,
            Side::B => ADDR_B,
        }
    }

    /// Name of namespace `a`.
    pub fn name_a(&self) -> &str {
        self.name(Side::A)
    }

    /// Name of namespace `b`.
    pub fn name_b(&self) -> &str {
        self.name(Side::B)
    }

    /// Interface name in namespace `a` (`vza`).
    pub fn ifname_a(&self) -> &'static str {
        self.ifname(Side::A)
    }

    /// Interface name in namespace `b` (`vzb`).
    pub fn ifname_b(&self) -> &'static str {
        self.ifname(Side::B)
    }

    /// Address of side `a` (`10.77.0.1`).
    pub fn addr_a(&self) -> Ipv4Addr {
        self.addr(Side::A)
    }

    /// Address of side `b` (`10.77.0.2`).
    pub fn addr_b(&self) -> Ipv4Addr {
        self.addr(Side::B)
    }

    /// Moves the calling thread into a side's network namespace, for good.
    ///
    /// Namespaces are per thread, so only this thread moves: sockets it creates afterwards
    /// live in the namespace, and keep living there when handed to other threads. There is
    /// no way back short of entering another namespace, so call this on a dedicated thread
    /// (`std::thread::spawn`), never on a test's main thread or a pooled one; prefer
    /// [`VethPair::run_in`], which does that for you.
    ///
    /// Beware `/proc/self/net/*`: `self` is the thread-group leader, which stays in the old
    /// namespace; use `/proc/thread-self/net/*` from the entered thread. `/proc/sys/net/*`
    /// does follow the calling thread.
    pub fn enter(&self, side: Side) -> Result<(), NetnsError> {
        let ns = self.namespace(side);
        ns.enter(&ns.open()?)
    }

    /// [`VethPair::enter`] for side `a`.
    pub fn enter_a(&self) -> Result<(), NetnsError> {
        self.enter(Side::A)
    }

    /// [`VethPair::enter`] for side `b`.
    pub fn enter_b(&self) -> Result<(), NetnsError> {
        self.enter(Side::B)
    }

    /// Runs `f` on a scoped thread that has entered a side's namespace, and returns its
    /// result. Sockets `f` creates (and returns) belong to that namespace.
    ///
    /// A panic in `f` is resumed on the calling thread, so test assertions inside `f` work as
    /// usual.
    pub fn run_in<R: Send>(
        &self,
        side: Side,
        f: impl FnOnce() -> R + Send,
    ) -> Result<R, NetnsError> {
        let ns = self.namespace(side);
        // Open in the caller so a missing namespace is reported without spawning.
        let handle = ns.open()?;
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name(format!("zc-netns-{side}"))
                .spawn_scoped(scope, move || {
                    ns.enter(&handle)?;
                    drop(handle);
                    Ok(f())
                })
                .map_err(|source| NetnsError::Thread {
                    namespace: ns.name.clone(),
                    source,
                })?;
            match worker.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// [`VethPair::run_in`] for side `a`.
    pub fn run_in_a<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
        self.run_in(Side::A, f)
    }

    /// [`VethPair::run_in`] for side `b`.
    pub fn run_in_b<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
        self.run_in(Side::B, f)
    }

    /// Sets a sysctl inside a side's namespace, like `sysctl -w key=value` there.
    ///
    /// `key` is dotted (`net.core.optmem_max`) or a path below `/proc/sys`
    /// (`net/ipv4/conf/vza/forwarding`, needed when a component contains a dot). Only
    /// per-namespace keys can be set: `net.core.optmem_max` is one since Linux 6.8; a key
    /// that is global on this kernel does not exist in the namespace and fails with
    /// `NotFound`.
    ///
    /// Why `/proc/sys` from an entered thread rather than `ip netns exec NS sysctl`: entries
    /// under `/proc/sys/net` are looked up in the *calling thread's* namespace, so this needs
    /// neither procps' `sysctl` binary nor the mount namespace `ip netns exec` sets up, and a
    /// failure comes back as a typed `io::Error`.
    pub fn sysctl(&self, side: Side, key: &str, value: &str) -> Result<(), NetnsError> {
        let path = sysctl_path(key)?;
        self.run_in(side, || std::fs::write(&path, value))?
            .map_err(|source| self.sysctl_error(side, key, source))
    }

    /// [`VethPair::sysctl`] for side `a`.
    pub fn sysctl_a(&self, key: &str, value: &str) -> Result<(), NetnsError> {
        self.sysctl(Side::A, key, value)
    }

    /// [`VethPair::sysctl`] for side `b`.
    pub fn sysctl_b(&self, key: &str, value: &str) -> Result<(), NetnsError> {
        self.sysctl(Side::B, key, value)
    }

    /// Reads a sysctl inside a side's namespace (trimmed); `key` as for [`VethPair::sysctl`].
    pub fn read_sysctl(&self, side: Side, key: &str) -> Result<String, NetnsError> {
        let path = sysctl_path(key)?;
        self.run_in(side, || std::fs::read_to_string(&path))?
            .map(|value| value.trim().to_owned())
            .map_err(|source| self.sysctl_error(side, key, source))
    }

    /// Brings a side's veth end administratively up or down (`ip link set IF up|down`).
    ///
    /// With `b` down, `a` loses carrier and whatever it sends towards `10.77.0.2` is dropped
    /// on `a`'s side (by the qdisc or the veth driver, counted as drops) instead of being
    /// delivered: a transmit-only sink. Bringing it up again restores the link; addresses
    /// are kept.
    pub fn set_link_up(&self, side: Side, up: bool) -> Result<(), NetnsError> {
        let state = if up { "up" } else { "down" };
        run_ip(&[
            "-n",
            self.name(side),
            "link",
            "set",
            self.ifname(side),
            state,
        ])
        .map(drop)
    }

    fn namespace(&self, side: Side) -> &Namespace {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    fn sysctl_error(&self, side: Side, key: &str, source: io::Error) -> NetnsError {
        NetnsError::Sysctl {
            namespace: self.name(side).to_owned(),
            key: key.to_owned(),
            source,
        }
    }
}

/// Says whether this host can build a [`VethPair`]: `Err` carries a human-readable reason
/// (not root, `ip` missing, no veth support, ...) for tests to print when they skip.
///
/// The probe builds and deletes a real pair, because that is the only reliable answer:
/// capabilities, container seccomp profiles and missing kernel modules all show up there and
/// nowhere else. The answer is computed once per process.
pub fn available() -> Result<(), Unavailable> {
    static ANSWER: OnceLock<Result<(), Unavailable>> = OnceLock::new();
    ANSWER
        .get_or_init(|| match VethPair::create(1500) {
            Ok(pair) => {
                drop(pair);
                Ok(())
            }
            Err(err) => Err(match effective_uid() {
                Some(0) | None => Unavailable::Refused(err.to_string()),
                Some(uid) => Unavailable::NotRoot {
                    uid,
                    probe: err.to_string(),
                },
            }),
        })
        .clone()
}

/// Why this host cannot build a [`VethPair`], for a test to print when it skips.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// Namespaces need `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`; `probe` is what the attempt said.
    #[error("network namespaces need root (running as uid {uid}); probe failed: {probe}")]
    NotRoot {
        /// The effective uid.
        uid: u32,
        /// The error the probe pair gave.
        probe: String,
    },
    /// Root, but the pair could not be built (no `ip`, no veth, a seccomp profile, ...).
    #[error("cannot build a veth pair in network namespaces: {0}")]
    Refused(String),
}

/// A named network namespace created by `ip netns add`, deleted on drop.
#[derive(Debug)]
struct Namespace {
    name: String,
}

impl Namespace {
    fn add(name: String) -> Result<Namespace, NetnsError> {
        run_ip(&["netns", "add", &name])?;
        Ok(Namespace { name })
    }

    fn path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.name)
    }

    fn open(&self) -> Result<File, NetnsError> {
        let path = self.path();
        File::open(&path).map_err(|source| NetnsError::Open { path, source })
    }

    fn enter(&self, handle: &File) -> Result<(), NetnsError> {
        enter_handle(handle.as_fd()).map_err(|source| NetnsError::Enter {
            namespace: self.name.clone(),
            source,
        })
    }
}

/// Moves the calling thread into the network namespace `fd` refers to (a bind-mounted
/// `/var/run/netns/NAME`, a `/proc/PID/ns/net` file or a pidfd): `setns(2)` with
/// `CLONE_NEWNET`. Only this thread moves; a network namespace may be joined by one thread of
/// a multithreaded process (the `EINVAL` for multithreaded callers applies to mount and user
/// namespaces only). Sockets the thread creates afterwards belong to that namespace for life.
pub fn enter_handle(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(fd, Some(rustix::thread::LinkNameSpaceType::Network))
        .map_err(io::Error::from)
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Err(err) = run_ip(&["netns", "del", &self.name]) {
            // `eprintln!` panics if stderr is gone; a drop during unwinding must not.
            let _ = writeln!(
                io::stderr(),
                "zcnet: could not delete network namespace {}: {err}",
                self.name
            );
        }
    }
}

/// `zc-<pid>-<counter>-<salt>`: the pid and counter make names unique within a pid
/// namespace; the clock salt separates processes in different containers that share
/// `/var/run/netns` and happen to have the same pid.
fn unique_stem() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let salt = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("zc-{}-{n}-{salt:08x}", std::process::id())
}

/// Maps `net.core.optmem_max` (or `net/core/optmem_max`) to its `/proc/sys` file, refusing
/// anything that could name a file outside `/proc/sys`.
fn sysctl_path(key: &str) -> Result<PathBuf, NetnsError> {
    let separator = if key.contains('/') { '/' } else { '.' };
    let mut path = PathBuf::from("/proc/sys");
    for part in key.split(separator) {
        if part.is_empty() || part == "." || part == ".." {
            return Err(NetnsError::InvalidSysctlKey {
                key: key.to_owned(),
            });
        }
        path.push(part);
    }
    Ok(path)
}

/// The `ip` binary: found on `PATH`, else in the usual sbin directories (a non-login root
/// shell or a CI runner may lack `/usr/sbin` on its `PATH`).
fn ip_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let path_dirs = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .unwrap_or_default();
        let fallback_dirs = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from);
        path_dirs
            .into_iter()
            .chain(fallback_dirs)
            .map(|dir| dir.join("ip"))
            .find(|candidate| candidate.is_file())
            .unwrap_or_else(|| PathBuf::from("ip"))
    })
}

/// Runs `ip ARGS...` and returns its stdout; a failure carries the command line and stderr.
fn run_ip(args: &[&str]) -> Result<String, NetnsError> {
    let command = || format!("ip {}", args.join(" "));
    let output = Command::new(ip_program())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::Spawn {
            command: command(),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: command(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Effective uid from `/proc/self/status` (`Uid: real effective saved fs`), for the reason
/// [`available`] gives; `None` if it cannot be read.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::net::{SocketAddr, TcpListener, TcpStream};

    /// For a test marked ignored without `zcnet_netns`: the build found root and `ip`, so
    /// a host that cannot build pairs now is a failure, with why.
    fn require_netns() {
        if let Err(reason) = available() {
            panic!(
                "network namespaces unavailable, though the build found root and `ip`: {reason}"
            );
        }
    }

    fn namespace_names() -> Vec<String> {
        run_ip(&["netns", "list"])
            .expect("ip netns list")
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    }

    fn link_mtu(ns: &str, ifname: &str) -> u32 {
        let out = run_ip(&["-n", ns, "-o", "link", "show", ifname]).expect("ip link show");
        let mut words = out.split_whitespace();
        words
            .find(|word| *word == "mtu")
            .and_then(|_| words.next())
            .and_then(|mtu| mtu.parse().ok())
            .unwrap_or_else(|| panic!("no mtu in {out:?}"))
    }

    /// The flags of `ip -o link show`, e.g. `["BROADCAST", "MULTICAST", "UP", "LOWER_UP"]`.
    fn link_flags(ns: &str, ifname: &str) -> Vec<String> {
        let out = run_ip(&["-n", ns, "-o", "link", "show", ifname]).expect("ip link show");
        let start = out.find('<').expect("flags start") + 1;
        let end = out.find('>').expect("flags end");
        out[start..end].split(',').map(str::to_owned).collect()
    }

    fn pattern(len: usize) -> Vec<u8> {
        // Not periodic in 256, so a dropped or repeated chunk cannot line up by accident.
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 ^ (i >> 12) as u8)
            .collect()
    }

    fn check_mtu(mtu: u32) {
        require_netns();
        let pair = VethPair::create(mtu).expect("create pair");
        assert_eq!(pair.mtu(), mtu);
        assert_eq!(link_mtu(pair.name_a(), pair.ifname_a()), mtu);
        assert_eq!(link_mtu(pair.name_b(), pair.ifname_b()), mtu);
        for side in [Side::A, Side::B] {
            let flags = link_flags(pair.name(side), pair.ifname(side));
            assert!(flags.iter().any(|f| f == "UP"), "{side}: {flags:?}");
            assert!(flags.iter().any(|f| f == "LOWER_UP"), "{side}: {flags:?}");
            assert!(link_flags(pair.name(side), "lo").iter().any(|f| f == "UP"));
        }
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn mtu_1500_is_set_on_both_ends() {
        check_mtu(1500);
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn mtu_9000_is_set_on_both_ends() {
        check_mtu(9000);
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn tcp_carries_one_mib_from_a_to_b() {
        require_netns();
        const LEN: usize = 1 << 20;
        let pair = VethPair::create(9000).expect("create pair");
        let listener = pair
            .run_in_b(|| TcpListener::bind((pair.addr_b(), 0)))
            .expect("enter b")
            .expect("bind in b");
        let to = listener.local_addr().expect("local_addr");
        assert_eq!(to.ip(), pair.addr_b());
        let sent = pattern(LEN);

        let (received, peer) = std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut stream = pair
                    .run_in_a(|| TcpStream::connect(to))
                    .expect("enter a")
                    .expect("connect from a");
                stream.write_all(&sent).expect("write");
                // Dropping closes the stream, which ends the reader's read_to_end.
            });
            let (mut stream, peer) = listener.accept().expect("accept");
            let mut received = Vec::with_capacity(LEN);
            stream.read_to_end(&mut received).expect("read");
            (received, peer)
        });
        assert_eq!(peer.ip(), pair.addr_a());
        assert_eq!(received.len(), LEN);
        assert!(received == sent, "payload corrupted");
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn addresses_are_local_to_their_own_namespace() {
        require_netns();
        let pair = VethPair::create(1500).expect("create pair");
        // Binding to b's address only works inside b: it is not a local address elsewhere.
        let addr_b = SocketAddr::from((pair.addr_b(), 0));
        pair.run_in_a(|| {
            let err = TcpListener::bind(addr_b).expect_err("10.77.0.2 is not local in a");
            assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
        })
        .expect("enter a");
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn drop_deletes_both_namespaces() {
        require_netns();
        let pair = VethPair::create(1500).expect("create pair");
        let names = [pair.name_a().to_owned(), pair.name_b().to_owned()];
        let listed = namespace_names();
        assert!(names.iter().all(|name| listed.contains(name)), "{listed:?}");
        drop(pair);
        let listed = namespace_names();
        assert!(
            names.iter().all(|name| !listed.contains(name)),
            "{listed:?}"
        );
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn drop_deletes_namespaces_when_a_test_panics() {
        require_netns();
        let names = std::panic::catch_unwind(|| {
            let pair = VethPair::create(1500).expect("create pair");
            std::panic::panic_any([pair.name_a().to_owned(), pair.name_b().to_owned()]);
        })
        .expect_err("closure panics")
        .downcast::<[String; 2]>()
        .expect("payload is the names");
        let listed = namespace_names();
        assert!(
            names.iter().all(|name| !listed.contains(name)),
            "{listed:?}"
        );
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn failed_create_reports_stderr_and_leaks_nothing() {
        require_netns();
        let err = VethPair::create(10).expect_err("mtu 10 is below veth's minimum");
        let NetnsError::Command {
            command, stderr, ..
        } = &err
        else {
            panic!("unexpected error {err:?}");
        };
        assert!(command.starts_with("ip link add vza mtu 10"), "{command}");
        assert!(!stderr.is_empty(), "{err}");
        assert!(err.to_string().contains(stderr.as_str()));
        // The namespaces created before the failing step are in the command line.
        let mut words = command.split_whitespace();
        let mut created = Vec::new();
        while let Some(word) = words.next() {
            if word == "netns" {
                created.push(words.next().expect("name after netns").to_owned());
            }
        }
        assert_eq!(created.len(), 2, "{command}");
        let listed = namespace_names();
        assert!(
            created.iter().all(|name| !listed.contains(name)),
            "{listed:?}"
        );
    }

    #[cfg_attr(
        not(zcnet_has_netns_optmem),
        ignore = "needs root, iproute2 and Linux 6.8 (optmem_max per network namespace)"
    )]
    #[test]
    fn sysctl_is_per_namespace() {
        require_netns();
        const KEY: &str = "net.core.optmem_max";
        let pair = VethPair::create(1500).expect("create pair");
        let root_before = std::fs::read_to_string("/proc/sys/net/core/optmem_max").unwrap();
        let b_before = match pair.read_sysctl(Side::B, KEY) {
            Ok(value) => value,
            Err(NetnsError::Sysctl { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                panic!("{KEY} is not per-namespace here, though the build found Linux 6.8")
            }
            Err(err) => panic!("{err}"),
        };
        let lowered = "4096";
        assert_ne!(b_before, lowered);
        pair.sysctl_a(KEY, lowered).expect("set in a");
        assert_eq!(pair.read_sysctl(Side::A, KEY).unwrap(), lowered);
        assert_eq!(pair.read_sysctl(Side::B, KEY).unwrap(), b_before);
        let root_after = std::fs::read_to_string("/proc/sys/net/core/optmem_max").unwrap();
        assert_eq!(root_after, root_before);
        // Slash form, and b can be set independently.
        pair.sysctl_b("net/core/optmem_max", "8192")
            .expect("set in b");
        assert_eq!(pair.read_sysctl(Side::B, KEY).unwrap(), "8192");
        assert_eq!(pair.read_sysctl(Side::A, KEY).unwrap(), lowered);
    }

    #[test]
    fn sysctl_keys_cannot_escape_proc_sys() {
        for key in [
            "",
            "net..core",
            "../../etc/passwd",
            "net/../../x",
            "/net/core",
        ] {
            assert!(
                matches!(sysctl_path(key), Err(NetnsError::InvalidSysctlKey { .. })),
                "{key:?}"
            );
        }
        assert_eq!(
            sysctl_path("net.core.optmem_max").unwrap(),
            Path::new("/proc/sys/net/core/optmem_max")
        );
        assert_eq!(
            sysctl_path("net/ipv4/conf/eth0.5/forwarding").unwrap(),
            Path::new("/proc/sys/net/ipv4/conf/eth0.5/forwarding")
        );
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn link_down_on_b_takes_carrier_from_a() {
        require_netns();
        let pair = VethPair::create(1500).expect("create pair");
        pair.set_link_up(Side::B, false).expect("b down");
        let b = link_flags(pair.name_b(), pair.ifname_b());
        assert!(!b.iter().any(|f| f == "UP"), "{b:?}");
        let a = link_flags(pair.name_a(), pair.ifname_a());
        assert!(a.iter().any(|f| f == "NO-CARRIER"), "{a:?}");

        // Sending from a still "works" from the socket's point of view; nothing arrives.
        let receiver = pair
            .run_in_b(|| std::net::UdpSocket::bind((pair.addr_b(), 0)))
            .expect("enter b")
            .expect("bind in b");
        receiver.set_nonblocking(true).unwrap();
        let to = receiver.local_addr().unwrap();
        pair.run_in_a(|| {
            let sender = std::net::UdpSocket::bind((pair.addr_a(), 0)).expect("bind in a");
            for _ in 0..4 {
                let _ = sender.send_to(&[0u8; 100], to);
            }
        })
        .expect("enter a");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let err = receiver
            .recv(&mut [0u8; 128])
            .expect_err("nothing delivered");
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);

        pair.set_link_up(Side::B, true).expect("b up");
        let a = link_flags(pair.name_a(), pair.ifname_a());
        assert!(a.iter().any(|f| f == "LOWER_UP"), "{a:?}");
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn entered_thread_stays_in_the_namespace() {
        require_netns();
        let pair = VethPair::create(1500).expect("create pair");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    pair.enter_b().expect("enter b");
                    // b's veth exists here, a's does not.
                    let net_dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
                    assert!(net_dev.contains("vzb:"), "{net_dev}");
                    assert!(!net_dev.contains("vza:"), "{net_dev}");
                    let listener = TcpListener::bind((pair.addr_b(), 0)).expect("bind in b");
                    drop(listener);
                })
                .join()
                .unwrap();
        });
        // The calling thread never moved.
        let net_dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        assert!(!net_dev.contains("vzb:"), "{net_dev}");
    }

    #[cfg_attr(
        not(zcnet_netns),
        ignore = "needs root and iproute2 (network namespaces)"
    )]
    #[test]
    fn parallel_pairs_get_distinct_names() {
        require_netns();
        let pairs: Vec<VethPair> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| VethPair::create(1500).expect("create pair")))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut names: Vec<&str> = pairs
            .iter()
            .flat_map(|p| [p.name_a(), p.name_b()])
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 8);
        for pair in &pairs {
            assert!(pair.name_a().len() > 3 && pair.name_a().ends_with("-a"));
        }
    }
}
