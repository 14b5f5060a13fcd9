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
