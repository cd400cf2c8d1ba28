//! `containerd-shim-gantry-v2`: entry point. Parses Go-style flags and dispatches to the
//! action the engine asked for.

use std::io::Write;

use anyhow::{Context, Result};
use gantry::args::{self, Action};
use gantry::{bootstrap, daemon};

fn main() {
    if let Err(e) = run() {
        eprintln!("containerd-shim-gantry-v2: {e:#}");
        std::process::exit(1);
    }
}

fn current_thread() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")
}

fn run() -> Result<()> {
    // Before any thread exists: nothing gantry starts may see the engine's systemd variables.
    gantry::environ::scrub();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // The fast path's container init: a fresh process of this binary, set up by the daemon.
    if argv.first().map(String::as_str) == Some("sandbox-init") {
        std::process::exit(gantry::sandbox::init::main(&argv[1..]));
    }
    // The rootfs mounts of a Create, away from the daemon (see gantry::mount).
    if argv.first().map(String::as_str) == Some(gantry::mount::HELPER_ARG) {
        std::process::exit(gantry::mount::helper_main());
    }
    // The user namespace an idmapped rootfs mount is made in (see gantry::mount::idmap).
    if argv.first().map(String::as_str) == Some(gantry::mount::idmap::HOLDER_ARG) {
        std::process::exit(gantry::mount::idmap::holder_main());
    }
    // The node exporter has flags of its own (`--listen`), not the shim's Go-style set.
    if argv.first().map(String::as_str) == Some("metrics") {
        return Ok(gantry::telemetry::exporter::run(&argv[1..])?);
    }
    // The node installer (the DaemonSet's pod, or by hand): flags of its own too.
    if let Some(action @ ("install" | "uninstall")) = argv.first().map(String::as_str) {
        std::process::exit(gantry::install::main(action, &argv[1..]));
    }
    let (flags, action) = args::parse(&argv)?;
    let mut out = std::io::stdout();
    match action {
        Action::Version => out.write_all(bootstrap::version_text().as_bytes())?,
        Action::Info => {
            let stdin = bootstrap::read_stdin();
            out.write_all(&current_thread()?.block_on(bootstrap::info(&stdin))?)?
        }
        Action::Features => {
            let defaults = gantry::options::EngineOptions::default();
            out.write_all(&current_thread()?.block_on(bootstrap::features(&defaults))?)?
        }
        Action::SeccompProfile(caps) => out.write_all(gantry::security::profile_json(caps.as_deref()).as_bytes())?,
        Action::RecordedProfile(name) => {
            let (config, _) = gantry::config::Config::resolve(None)?;
            let dir = &config.security.seccomp_recording_dir;
            out.write_all(gantry::security::record::recorded_json(dir, &name)?.as_bytes())?
        }
        Action::CheckConfig(path) => out.write_all(bootstrap::check_config(path.as_deref())?.as_bytes())?,
        Action::Start => {
            let stdin = bootstrap::read_stdin();
            match bootstrap::start(&flags, &stdin)? {
                bootstrap::Started::Address(address) => out.write_all(address.as_bytes())?,
                // The forked daemon: `start`'s work is done, this process serves from here on.
                bootstrap::Started::Daemon(daemon_flags, config) => {
                    drop(stdin);
                    daemon::serve(&daemon_flags, *config)?
                }
            }
        }
        Action::Delete => {
            let resp = current_thread()?.block_on(bootstrap::delete(&flags))?;
            out.write_all(&protobuf::Message::write_to_bytes(&resp)?)?;
        }
        Action::Serve => daemon::serve(&flags, gantry::config::Config::resolve(None).unwrap_or_default().0)?,
    }
    out.flush()?;
    Ok(())
}
