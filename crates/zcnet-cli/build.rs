//! Two jobs, both about what this build can find:
//!
//! * Sets the `cfg`s that mark this crate's tests needing a program, root or network
//!   namespaces as ignored, with their reason, where this machine lacks them (see
//!   `probe.rs`, a link to `crates/zcnet-testbed/probe.rs`).
//! * Carries `libzcnet_preload.so` inside the `zcnet` binary when this crate is built from its
//!   package — as `cargo install zcnet-cli` builds it, leaving nothing but the binary, so
//!   nothing else would put the library where `zcnet run` looks (`src/preload_lib.rs`). A
//!   checkout finds the library beside the binary instead and carries none
//!   (`ZCNET_BUNDLE_PRELOAD=1` forces it, `=0` turns it off).
//!
//! zcnet-preload is a normal dependency of this crate, and a dependency's `cdylib` is
//! linked into `<target>/<profile>/deps/` by the same rustc call as its rlib; cargo starts
//! compiling a binary only once its dependencies are fully built, so the file exists when
//! `include_bytes!` reads it. This script only names it: `OUT_DIR` is
//! `<target>/<profile>/build/zcnet-cli-<hash>/out`.

use std::path::PathBuf;

include!("probe.rs");

fn main() {
    zcnet_probe(&[
        "curl",
        "python3",
        "nginx",
        "socat",
        "iperf3",
        "redis-server",
        "redis-cli",
        "redis-benchmark",
        "rsync",
        "prlimit",
        "cc",
        "ssh",
        "scp",
        "sshd",
        "setcap",
        "setpriv",
    ]);
    zcnet_probe_host(&[
        "cgroup_pids",
        "two_cpus",
        "static_ldconfig",
        "setuid_program",
        "liburing",
    ]);
    bundle_preload();
}

fn bundle_preload() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_bundled_preload)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=ZCNET_BUNDLE_PRELOAD");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    // `cargo package` keeps the author's manifest as Cargo.toml.orig: built from a package.
    let packaged = manifest.join("Cargo.toml.orig").is_file();
    let carry = match std::env::var("ZCNET_BUNDLE_PRELOAD").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => packaged,
    };
    if !carry {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    let lib = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out")
        .join("deps/libzcnet_preload.so");
    println!("cargo::rustc-env=ZCNET_BUNDLED_PRELOAD={}", lib.display());
    println!("cargo::rustc-cfg=zcnet_bundled_preload");
}
