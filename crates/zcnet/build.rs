//! Builds zcnet's XDP program (`bpf/xsk_redirect.c`) with `clang -target bpf` into OUT_DIR,
//! where `xsk::program` embeds it (docs/lm-afxdp.md, "Why these crates").
//!
//! Without clang the library still builds: the program is left out (`zcnet_xdp_prog` unset),
//! `zcnet probe` and the AF_XDP tests then say so. Under CI (`CI` set) a missing or failing
//! clang is an error instead, so a runner without it cannot pass by skipping. `CLANG` names
//! another compiler (e.g. `clang-14`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/xsk_redirect.c";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_xdp_prog)");
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=CI");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("xsk_redirect.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    // -g: BTF, which the `.maps` section's map definitions need. -O2: the verifier wants the
    // bounds checks kept next to the loads they guard.
    let result = Command::new(&clang)
        .args([
            "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-c", SOURCE, "-o",
        ])
        .arg(&obj)
        .output();
    let why = match result {
        Ok(o) if o.status.success() => {
            println!("cargo::rustc-cfg=zcnet_xdp_prog");
            return;
        }
        Ok(o) => format!(
            "`{clang}` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("could not run `{clang}`: {e} (install clang, or set CLANG)"),
    };
    if env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false") {
        panic!("zcnet: the XDP program must build under CI: {why}");
    }
    println!("cargo::warning=zcnet: XDP program not built, AF_XDP receive unavailable: {why}");
}
