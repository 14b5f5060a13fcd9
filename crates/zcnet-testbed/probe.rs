// What this machine can run, for the build scripts of the crates whose tests need a program,
// root or network namespaces: each found condition becomes a `cfg`, and a test that needs a
// missing one is marked
//
//     #[cfg_attr(not(zcnet_netns), ignore = "needs root and iproute2 (network namespaces)")]
//
// so `cargo test` counts it as ignored, with its reason, instead of a pass that ran nothing.
// Included (`include!`) by each such crate's build.rs; plain std, as build scripts are.
//
// cfgs: `zcnet_root` (effective uid 0), `zcnet_netns` (root and `ip`), and
// `zcnet_has_<program>` (`-` as `_`) for each program asked about, found on PATH.
//
// Re-probed when PATH, HOME (another user builds) or ZCNET_REQUIRE_ALL changes, or when a
// directory on PATH does (a program installed or removed). With ZCNET_REQUIRE_ALL=1 (set by
// .ci/run, which installs every program and runs as root) a missing condition fails the
// build, so nothing is ignored there.

#[allow(dead_code)]
fn zcnet_probe(programs: &[&str]) {
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=HOME");
    println!("cargo::rerun-if-env-changed=ZCNET_REQUIRE_ALL");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path)
        .filter(|d| d.is_dir())
        .collect();
    for d in &dirs {
        println!("cargo::rerun-if-changed={}", d.display());
    }
    let found = |p: &str| dirs.iter().any(|d| d.join(p).is_file());
    let require_all = std::env::var("ZCNET_REQUIRE_ALL").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut missing = Vec::new();
    let mut set = |cfg: String, ok: bool, what: String| {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if ok {
            println!("cargo::rustc-cfg={cfg}");
        } else {
            missing.push(what);
        }
    };
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    set("zcnet_root".into(), root, "root".into());
    set(
        "zcnet_netns".into(),
        root && found("ip"),
        "network namespaces (root and `ip`)".into(),
    );
    for p in programs {
        set(
            format!("zcnet_has_{}", p.replace(['-', '.'], "_")),
            found(p),
            format!("program `{p}`"),
        );
    }
    if require_all && !missing.is_empty() {
        panic!(
            "ZCNET_REQUIRE_ALL is set but this machine lacks: {} (.ci/run installs them and runs as root)",
            missing.join(", ")
        );
    }
}

// Host facts some tests need beyond programs and root, each found here the way the library
// or the test finds it at run time, as `zcnet_has_<name>`:
//
// * `thp`: transparent huge pages a `MADV_HUGEPAGE` mapping may get (`always` or `madvise`
//   in /sys/kernel/mm/transparent_hugepage/enabled; `zcnet_sys::mem::thp_available`).
// * `schedstat`: per-thread CPU clocks (/proc/thread-self/schedstat, CONFIG_SCHED_INFO).
// * `holes`: a file under the temp directory (TMPDIR, where `tempfile` puts test files)
//   keeps holes: 64 MiB with 1 MiB written allocates less than 8 MiB.
// * `dev_shm`: a writable /dev/shm (where a sender leaves its card, `zcnet::peer_card`).
// * `ipv6_loopback`: a UDP socket binds [::1].
// * `netns_optmem`: `net.core.optmem_max` is per network namespace (Linux 6.8), with
//   network namespaces themselves.
// * `cgroup_pids`: a writable cgroup-v1 `pids` hierarchy (root, /sys/fs/cgroup/pids).
// * `two_cpus`: at least two CPUs to run on.
// * `uring`: io_uring may send with `SEND_ZC` (Linux 6.0, and
//   `kernel.io_uring_disabled` 0, or 1 for root). A seccomp profile that refuses io_uring
//   cannot be seen from here: a test then fails saying so, never passes having run nothing.
// * `io_uring`: a process may make an io_uring ring at all (Linux 5.1, not disabled; same
//   caveat for seccomp).
// * `openat2`: `openat2(2)` with `RESOLVE_BENEATH` (Linux 5.6), as
//   `zcnet_transfer::resolve::kernel_resolution` finds it (same caveat for seccomp).
// * `liburing`: liburing's header, shared and static library (liburing-dev), and a kernel
//   whose io_uring reads files (Linux 5.6, not disabled), for C programs built against it.
// * `static_ldconfig`: /sbin/ldconfig is statically linked (glibc's is), a program the
//   loader will not preload into.
// * `setuid_program`: one of /usr/bin/passwd, /bin/su, /usr/bin/chfn is setuid.
// * `ktls`: the kernel's TLS ULP is loaded (`tls` in /proc/sys/net/ipv4/tcp_available_ulp;
//   `modprobe tls`), so a connection can hand its keys to the kernel.
//
// With ZCNET_REQUIRE_ALL=1 a missing fact fails the build, as a missing program does,
// unless ZCNET_ALLOW_MISSING (a comma-separated list of these names) excuses it: a fact the
// CI machine's kernel cannot have (.ci/run names it, and lets only its reason through its
// check for ignored tests), ignored with its reason like any other.
#[allow(dead_code)]
fn zcnet_probe_host(facts: &[&str]) {
    println!("cargo::rerun-if-env-changed=TMPDIR");
    println!("cargo::rerun-if-env-changed=ZCNET_REQUIRE_ALL");
    println!("cargo::rerun-if-env-changed=ZCNET_ALLOW_MISSING");
    let require_all = std::env::var("ZCNET_REQUIRE_ALL").is_ok_and(|v| !v.is_empty() && v != "0");
    let excused = std::env::var("ZCNET_ALLOW_MISSING").unwrap_or_default();
    let excused: Vec<&str> = excused.split(',').map(str::trim).collect();
    let uid0 = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false);
    // (major, minor) of the running kernel.
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|r| {
            let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
            Some((it.next()?.parse::<u32>().ok()?, it.next()?.parse::<u32>().ok()?))
        })
        .unwrap_or((0, 0));
    // `kernel.io_uring_disabled`: 0 lets anyone make a ring, 1 only root (strictly: members
    // of `kernel.io_uring_group` too), 2 no one.
    let uring_allowed = match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0)
    {
        0 => true,
        1 => uid0,
        _ => false,
    };
    let on_path = |p: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join(p).is_file())
    };
    let mut missing = Vec::new();
    for &fact in facts {
        let (ok, what): (bool, &str) = match fact {
            "thp" => {
                const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
                println!("cargo::rerun-if-changed={THP}");
                (
                    std::fs::read_to_string(THP)
                        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]")),
                    "transparent huge pages (always or madvise)",
                )
            }
            "schedstat" => (
                std::path::Path::new("/proc/thread-self/schedstat").exists(),
                "per-thread schedstat (CONFIG_SCHED_INFO)",
            ),
            "holes" => (zcnet_probe_holes(), "a temp directory that keeps holes"),
            "dev_shm" => (
                std::fs::metadata("/dev/shm").is_ok_and(|m| m.is_dir())
                    && zcnet_probe_writable(std::path::Path::new("/dev/shm")),
                "a writable /dev/shm",
            ),
            "ipv6_loopback" => (
                std::net::UdpSocket::bind("[::1]:0").is_ok(),
                "IPv6 loopback",
            ),
            "netns_optmem" => (
                uid0 && on_path("ip") && kernel >= (6, 8),
                "optmem_max per network namespace (Linux 6.8, root and `ip`)",
            ),
            "cgroup_pids" => (
                uid0 && std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs").is_file(),
                "a writable cgroup-v1 pids hierarchy (root)",
            ),
            "two_cpus" => (
                std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2),
                "two CPUs",
            ),
            "uring" => (
                kernel >= (6, 0) && uring_allowed,
                "io_uring SEND_ZC (Linux 6.0, kernel.io_uring_disabled 0)",
            ),
            "io_uring" => (
                kernel >= (5, 1) && uring_allowed,
                "io_uring (Linux 5.1, kernel.io_uring_disabled 0)",
            ),
            "openat2" => (kernel >= (5, 6), "openat2 (Linux 5.6)"),
            "liburing" => {
                let lib = |f: &str| {
                    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]
                        .iter()
                        .any(|d| std::path::Path::new(d).join(f).is_file())
                };
                (
                    kernel >= (5, 6)
                        && uring_allowed
                        && std::path::Path::new("/usr/include/liburing.h").is_file()
                        && lib("liburing.so")
                        && lib("liburing.a"),
                    "liburing, shared and static (apt-get install liburing-dev), and io_uring reads (Linux 5.6)",
                )
            }
            "static_ldconfig" => (
                std::fs::read("/sbin/ldconfig").is_ok_and(|img| zcnet_probe_static_elf(&img)),
                "a statically linked /sbin/ldconfig",
            ),
            "setuid_program" => (
                ["/usr/bin/passwd", "/bin/su", "/usr/bin/chfn"].iter().any(|p| {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o4000 != 0)
                }),
                "a setuid program (passwd, su or chfn)",
            ),
            "ktls" => {
                const ULP: &str = "/proc/sys/net/ipv4/tcp_available_ulp";
                (
                    std::fs::read_to_string(ULP)
                        .is_ok_and(|s| s.split_whitespace().any(|u| u == "tls")),
                    "the kernel's TLS ULP (modprobe tls)",
                )
            }
            other => panic!("zcnet_probe_host: unknown fact {other:?}"),
        };
        let cfg = format!("zcnet_has_{fact}");
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if ok {
            println!("cargo::rustc-cfg={cfg}");
        } else if !excused.contains(&fact) {
            missing.push(what);
        }
    }
    if require_all && !missing.is_empty() {
        panic!(
            "ZCNET_REQUIRE_ALL is set but this machine lacks: {} (ZCNET_ALLOW_MISSING may excuse a fact by name)",
            missing.join(", ")
        );
    }
}

/// Whether `dir` takes a new file (made and removed again).
#[allow(dead_code)]
fn zcnet_probe_writable(dir: &std::path::Path) -> bool {
    let p = dir.join(format!("zcnet-probe-{}", std::process::id()));
    let ok = std::fs::File::create(&p).is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}

/// Whether a file in the temp directory keeps holes, as the sparse-file tests need.
#[allow(dead_code)]
fn zcnet_probe_holes() -> bool {
    use std::os::unix::fs::{FileExt, MetadataExt};
    const MIB: u64 = 1 << 20;
    let p = std::env::temp_dir().join(format!("zcnet-probe-holes-{}", std::process::id()));
    let kept = (|| {
        let f = std::fs::File::create(&p).ok()?;
        f.write_all_at(&vec![1u8; MIB as usize], 8 * MIB).ok()?;
        f.set_len(64 * MIB).ok()?;
        f.sync_all().ok()?;
        Some(f.metadata().ok()?.blocks() * 512 <= 8 * MIB)
    })()
    .unwrap_or(false);
    let _ = std::fs::remove_file(&p);
    kept
}

/// Whether `img` is a 64-bit little-endian ELF executable with no program interpreter
/// (`PT_INTERP`): statically linked, static-pie included, as the loader sees it.
#[allow(dead_code)]
fn zcnet_probe_static_elf(img: &[u8]) -> bool {
    let u16_at = |o: usize| img.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| {
        img.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        img.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(|b: [u8; 8]| u64::from_le_bytes(b) as usize)
    };
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if !img.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    (0..phnum).all(|i| u32_at(phoff + i * phentsize).is_some_and(|t| t != PT_INTERP))
}
