//! Embeds the git revision and compiler version for `-v` and `-info`.
use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let ver = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=GANTRY_GIT_REVISION={rev}");
    println!("cargo:rustc-env=GANTRY_RUSTC_VERSION={ver}");
    symbol_order();
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}

/// Lays out the functions a daemon really runs (link/symbol-order.txt, made by
/// scripts/symbol-order.sh) first and contiguously, so each daemon maps a dense run of hot code
/// rather than 64 KiB fault-around windows all over the executable. Only for lld, the default
/// linker of Rust's x86_64 Linux target since 1.90; `GANTRY_SYMBOL_ORDER=off` skips it.
fn symbol_order() {
    println!("cargo:rerun-if-env-changed=GANTRY_SYMBOL_ORDER");
    println!("cargo:rerun-if-changed=link/symbol-order.txt");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let lld_default = env("CARGO_CFG_TARGET_ARCH") == "x86_64" && env("CARGO_CFG_TARGET_OS") == "linux";
    let file = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join("link/symbol-order.txt");
    if env("GANTRY_SYMBOL_ORDER") == "off" || !lld_default || !file.exists() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
        file.display()
    );
}
