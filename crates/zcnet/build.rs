//! Builds zcnet's XDP programs (`bpf/xsk_redirect.c`, `bpf/lm.c`) with `clang -target bpf`
//! into OUT_DIR, where `xsk::program` and `lm::program` embed them (docs/lm-afxdp.md, "Which
//! crates, and why").
//!
//! Without clang the library still builds: the program is left out (`zcnet_xdp_prog` unset),
//! `zcnet probe` and the AF_XDP tests then say so. Under CI (`CI` set) a missing or failing
//! clang is an error instead, so a runner without it cannot pass by skipping. `CLANG` names
//! another compiler (e.g. `clang-14`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCES: [&str; 2] = ["bpf/xsk_redirect.c", "bpf/lm.c"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(zcnet_xdp_prog)");
    for source in SOURCES {
        println!("cargo::rerun-if-changed={source}");
    }
    println!("cargo::rerun-if-env-changed=CLANG");
    println!("cargo::rerun-if-env-changed=CI");

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let why = SOURCES
        .iter()
        .find_map(|source| compile(&clang, source, &out).err());
    let Some(why) = why else {
        println!("cargo::rustc-cfg=zcnet_xdp_prog");
        return;
    };
    if env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false") {
        panic!("zcnet: the XDP program must build under CI: {why}");
    }
    println!("cargo::warning=zcnet: XDP programs not built, AF_XDP receive unavailable: {why}");
}

/// `bpf/NAME.c` → `OUT_DIR/NAME.o`, or why not.
fn compile(clang: &str, source: &str, out: &std::path::Path) -> Result<(), String> {
    let stem = std::path::Path::new(source)
        .file_stem()
        .expect("sources are files");
    let obj = out.join(stem).with_extension("o");
    // -g: BTF, which the `.maps` section's map definitions need. -O2: the verifier wants the
    // bounds checks kept next to the loads they guard.
    let result = Command::new(clang)
        .args([
            "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-c", source, "-o",
        ])
        .arg(&obj)
        .output();
    match result {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{clang}` failed on {source} ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!(
            "could not run `{clang}`: {e} (install clang, or set CLANG)"
        )),
    }
}
