//! What Create's spec work costs, and what moving it off the reactor thread costs.
//!
//! Create reads config.json, injects devices (CDI directory scans and YAML), validates the
//! seccomp profile with libseccomp, and renders the edited spec; the daemon runs all of it on
//! a blocking-pool thread so other requests are not held up. This times, on this machine:
//!
//! - `spec work`: `spec::load` + `spec::edit_for_create` for a container with a 2-GPU CDI
//!   request (fake nodes and an `nvidia-ctk`-shaped spec) and the RuntimeDefault seccomp
//!   profile: the first run (libseccomp's validation is cached per profile after it) and the
//!   median of the rest;
//! - `stats`: the cgroup reads of one `Stats` request, on this process's own cgroup;
//! - `hop`: the median round trip of an empty `spawn_blocking` on a current-thread runtime
//!   built as the daemon builds it, with the pool thread warm and cold (after its keep-alive).
//!
//!   cargo run --release --example create_cost [-- RUNS]     (as root: it makes device nodes)

use std::time::{Duration, Instant};

#[allow(dead_code)]
#[path = "../src/devices/fixture.rs"]
mod gpu_fixture;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn main() -> anyhow::Result<()> {
    let runs: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200);
    let host = tempfile::tempdir()?;
    let dev = host.path().join("dev");
    gpu_fixture::make_fake_nvidia(&dev, 2, 235)?;
    let cdi = host.path().join("cdi");
    let lib = host.path().join("libcuda.so.1");
    std::fs::write(&lib, "x")?;
    gpu_fixture::write_nvidia_cdi_spec(&cdi, &dev, 2, "/bin/true", vec![], &lib)?;
    let mut config = gantry::config::Config::default();
    config.devices.cdi_spec_dirs = vec![cdi];
    config.devices.dev_root = dev;
    config.devices.nvidia_visible_devices = true;

    let bundle = host.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs"))?;
    let caps: Vec<String> = ["CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
        .map(String::from)
        .into();
    let profile = gantry::security::seccomp::runtime_default(&caps, std::env::consts::ARCH);
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["/bin/true"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "env": ["NVIDIA_VISIBLE_DEVICES=0,1"],
                    "capabilities": {"bounding": caps, "effective": caps, "permitted": caps}},
        "root": {"path": "rootfs"},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}], "seccomp": profile},
    });
    let raw = serde_json::to_vec(&spec)?;

    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        std::fs::write(bundle.join("config.json"), &raw)?;
        let t = Instant::now();
        let loaded = gantry::spec::load(&bundle)?;
        let edited = gantry::spec::edit_for_create(&bundle, loaded, &config, std::path::Path::new("/run/no-listener"))?;
        times.push(t.elapsed());
        anyhow::ensure!(edited.edits.devices.devices.len() == 2, "expected 2 devices injected");
    }
    let first = times.remove(0);
    println!(
        "spec work (2 GPUs by CDI, RuntimeDefault seccomp): first {}, median {}",
        micros(first),
        micros(median(times))
    );

    // Stats: the cgroup reads of one request, on this process's own cgroup.
    let cgroup = gantry::cgroups::ContainerCgroup::for_pid(std::process::id() as i32)?;
    let stats: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let _ = cgroup.metrics_any();
            t.elapsed()
        })
        .collect();
    println!(
        "stats (one Stats request's cgroup reads): median {}",
        micros(median(stats))
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(gantry::daemon::BLOCKING_KEEP_ALIVE)
        .build()?;
    let (warm, cold) = rt.block_on(async {
        let hop = || async {
            let t = Instant::now();
            tokio::task::spawn_blocking(|| ()).await.ok();
            t.elapsed()
        };
        let mut warm = Vec::new();
        for _ in 0..runs {
            warm.push(hop().await);
        }
        let mut cold = Vec::new();
        for _ in 0..5 {
            tokio::time::sleep(gantry::daemon::BLOCKING_KEEP_ALIVE * 2).await;
            cold.push(hop().await);
        }
        (median(warm), median(cold))
    });
    println!(
        "hop (spawn_blocking round trip): warm {}, cold (new thread) {}",
        micros(warm),
        micros(cold)
    );
    Ok(())
}
