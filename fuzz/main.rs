//! Fuzz targets for everything gantry parses from outside: the stdio URI parser, `start`'s
//! stdin (runtime options `Any`, BootstrapParams), the shim config parser, CDI specs (JSON and
//! YAML) with device name requests, and the spec-edit pipeline (config.json bytes + device
//! requests → edited spec). Inputs are proptest strategies over the committed seeds in
//! `fuzz/corpus/<target>/`, mutated bytewise and structurally, plus free-form values.
//!
//! Each target runs for `GANTRY_FUZZ_SECS` seconds (default 3, so `cargo test` stays quick;
//! `scripts/fuzz.sh` runs 60 s per target). A panic anywhere fails the target with the shrunk
//! input; proptest records it under `fuzz/regressions/` and replays it on every later run.

use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;

/// The library's GPU fixtures, compiled into this target.
#[allow(dead_code)]
#[path = "../src/devices/fixture.rs"]
mod gpu_fixture;
use proptest::test_runner::{Config as RunnerConfig, FileFailurePersistence, TestRunner};

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect();
    seeds.sort();
    seeds
}

/// A seed with a few byte edits: flips, insertions, deletions and splices of a range.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let seeds = if seeds.is_empty() { vec![Vec::new()] } else { seeds };
    let ops = prop::collection::vec((0u8..4, any::<usize>(), any::<u8>(), 0usize..64), 0..8);
    (prop::sample::select(seeds), ops).prop_map(|(mut data, ops)| {
        for (op, at, byte, len) in ops {
            let at = if data.is_empty() { 0 } else { at % data.len() };
            match op {
                0 if !data.is_empty() => data[at] ^= byte | 1,
                1 => data.insert(at, byte),
                2 if !data.is_empty() => {
                    let end = (at + len).min(data.len());
                    data.drain(at..end);
                }
                _ => {
                    let end = (at + len).min(data.len());
                    let chunk = data[at..end].to_vec();
                    let to = (at + byte as usize).min(data.len());
                    data.splice(to..to, chunk);
                }
            }
        }
        data
    })
}

/// A JSON seed with one value somewhere replaced by an arbitrary JSON value (type confusion,
/// odd strings, deep nesting), re-serialised.
fn json_mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let docs: Vec<serde_json::Value> = seeds.iter().filter_map(|s| serde_json::from_slice(s).ok()).collect();
    let docs = if docs.is_empty() {
        vec![serde_json::json!({})]
    } else {
        docs
    };
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        ".{0,24}".prop_map(serde_json::Value::from),
        "(CAP_[A-Z_]{1,12}|nvidia.com/gpu=[0-9a-z]{0,4}|[a-z.]{1,10}/[a-z]{1,6}=[a-z0-9,]{0,8})"
            .prop_map(serde_json::Value::from),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-zA-Z.]{1,12}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    (
        prop::sample::select(docs),
        prop::collection::vec((any::<usize>(), value), 1..4),
    )
        .prop_map(|(mut doc, edits)| {
            for (pick, v) in edits {
                replace_somewhere(&mut doc, pick, v);
            }
            serde_json::to_vec(&doc).unwrap_or_default()
        })
}

/// Replaces the `pick`-th value of a depth-first walk (modulo the count) with `v`.
fn replace_somewhere(doc: &mut serde_json::Value, pick: usize, v: serde_json::Value) {
    fn count(d: &serde_json::Value) -> usize {
        1 + match d {
            serde_json::Value::Array(a) => a.iter().map(count).sum(),
            serde_json::Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(d: &mut serde_json::Value, n: &mut usize, v: &mut Option<serde_json::Value>) {
        if *n == 0 {
            if let Some(v) = v.take() {
                *d = v;
            }
            return;
        }
        *n -= 1;
        match d {
            serde_json::Value::Array(a) => a.iter_mut().for_each(|x| walk(x, n, v)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|x| walk(x, n, v)),
            _ => {}
        }
    }
    let mut n = pick % count(doc);
    walk(doc, &mut n, &mut Some(v));
}

/// Runs `target` on values of `strategy` until the time budget is spent.
fn fuzz<S: Strategy>(name: &str, strategy: S, target: impl Fn(S::Value))
where
    S::Value: std::fmt::Debug,
{
    let secs: u64 = std::env::var("GANTRY_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let regressions = format!("{}/fuzz/regressions/{name}.txt", env!("CARGO_MANIFEST_DIR"));
    let config = RunnerConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(Box::leak(
            regressions.into_boxed_str(),
        )))),
        ..RunnerConfig::default()
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ran = std::cell::Cell::new(0u64);
    while Instant::now() < deadline {
        // A runner counts its cases once; a fresh one (fresh random seed) per round.
        if let Err(e) = TestRunner::new(config.clone()).run(&strategy, |v| {
            ran.set(ran.get() + 1);
            target(v);
            Ok(())
        }) {
            panic!("fuzz target {name}: {e}");
        }
    }
    println!("fuzz {name}: {} inputs in {secs} s, no failure", ran.get());
}

#[test]
fn stdio_uris() {
    let seeds: Vec<Vec<u8>> = corpus("uri")
        .iter()
        .flat_map(|f| f.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect::<Vec<_>>())
        .collect();
    let strategy = prop_oneof![
        mutated(seeds).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        "(file|binary|fifo|tcp)://[^\n]{0,40}",
        "(binary:///[a-z/]{1,10}\\?)?([%a-zA-Z0-9=&é\u{1F600}]{0,30})",
        any::<String>(),
    ];
    fuzz("uri", strategy, |s| {
        if let Ok(gantry::io::Target::File(p) | gantry::io::Target::Binary { path: p, .. }) =
            gantry::io::parse_target(&s)
        {
            assert!(p.is_absolute(), "{s:?} gave a relative path {p:?}");
        }
    });
}

fn stdin_seeds() -> Vec<Vec<u8>> {
    use containerd_shim_protos::protobuf::Message;
    use protobuf::well_known_types::any::Any;
    let runc = containerd_shim_protos::shim::oci::Options {
        binary_name: "crun".into(),
        root: "/run/x".into(),
        systemd_cgroup: true,
        ..Default::default()
    };
    let runc_any = Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: runc.write_to_bytes().unwrap_or_default(),
        ..Default::default()
    };
    let mut ro = vec![0x12u8, 14];
    ro.extend_from_slice(b"/etc/gantry.tm");
    let ro_any = Any {
        type_url: "runtimeoptions.v1.Options".into(),
        value: ro,
        ..Default::default()
    };
    let mut ext = containerd_shim_protos::bootstrap_api::Extension::new();
    ext.value = protobuf::MessageField::some(runc_any.clone());
    let params = containerd_shim_protos::bootstrap_api::BootstrapParams {
        instance_id: "c".into(),
        namespace: "k8s.io".into(),
        extensions: vec![ext],
        ..Default::default()
    };
    let mut seeds = corpus("stdin");
    for m in [
        runc_any.write_to_bytes(),
        ro_any.write_to_bytes(),
        params.write_to_bytes(),
    ] {
        seeds.push(m.unwrap_or_default());
    }
    seeds
}

#[test]
fn start_stdin() {
    let strategy = prop_oneof![mutated(stdin_seeds()), prop::collection::vec(any::<u8>(), 0..512)];
    fuzz("stdin", strategy, |data| {
        let _ = gantry::options::from_stdin(&data, "c", "k8s.io");
    });
}

#[test]
fn shim_config() {
    let keys = "(shim|runtime|devices|runtime\\.timeouts|security|events)";
    let fields = "(socket_dir|log_level|binary|root|systemd_cgroup|cdi_spec_dirs|create|default|allow_all|x)";
    let line = format!("(\\[{keys}\\]|{fields} = (\"[a-z/]{{0,8}}\"|[0-9]{{1,12}}|true|\\[\\]|\\{{\\}}|-1))");
    let strategy = prop_oneof![
        mutated(corpus("config")).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        prop::collection::vec(
            proptest::string::string_regex(&line).unwrap_or_else(|e| panic!("{e}")),
            0..12
        )
        .prop_map(|l| l.join("\n")),
        any::<String>(),
    ];
    fuzz("config", strategy, |text| {
        if let Err(e) = gantry::config::Config::parse(Path::new("/fuzz.toml"), &text) {
            assert!(e.to_string().contains("/fuzz.toml"), "error without the file: {e}");
        }
    });
}

/// CDI spec files (fuzzed, JSON or YAML) read through the device-injection path, with a
/// fuzzed device name requested by annotation from an otherwise good config.json.
#[test]
fn cdi_specs_and_names() {
    let seeds = corpus("cdi");
    let yaml: Vec<Vec<u8>> = seeds
        .iter()
        .filter(|s| serde_json::from_slice::<serde_json::Value>(s).is_err())
        .cloned()
        .collect();
    let strategy = (
        prop_oneof![json_mutated(seeds.clone()), mutated(seeds), mutated(yaml)],
        any::<bool>(),
        "(nvidia.com/gpu|vendor.com/device|[a-z.]{0,8}/[a-z]{0,5})=([0-9]|all|dev0|[a-zA-Z0-9_.:-]{0,8})",
    );
    let host = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let specs = host.path().join("cdi");
    let bundle = host.path().join("bundle");
    let _ = std::fs::create_dir_all(bundle.join("rootfs"));
    let mut config = gantry::config::Config::default();
    config.devices.cdi_spec_dirs = vec![specs.clone()];
    config.devices.dev_root = host.path().join("dev");
    let base: serde_json::Value =
        serde_json::from_slice(&corpus("spec").into_iter().next().unwrap_or_default()).unwrap_or_default();
    fuzz("cdi", strategy, |(data, as_yaml, name)| {
        let _ = std::fs::remove_dir_all(&specs);
        let _ = std::fs::create_dir_all(&specs);
        let _ = std::fs::write(specs.join(if as_yaml { "x.yaml" } else { "x.json" }), &data);
        let mut spec = base.clone();
        spec["annotations"] = serde_json::json!({ "gantry.dev/devices": name });
        let _ = std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&spec).unwrap_or_default(),
        );
        if let Ok(mut loaded) = gantry::spec::load(&bundle) {
            let _ = gantry::spec::edit(&bundle, &mut loaded, &config, std::path::Path::new("/run/no-listener"));
        }
    });
}

#[test]
fn spec_edit_pipeline() {
    let seeds = corpus("spec");
    let host = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let dev = host.path().join("dev");
    gpu_fixture::make_fake_nvidia(&dev, 2, 235).unwrap_or_else(|e| panic!("fake nodes: {e}"));
    let cdi = host.path().join("cdi");
    let lib = host.path().join("libcuda.so.1");
    let _ = std::fs::write(&lib, "x");
    gpu_fixture::write_nvidia_cdi_spec(&cdi, &dev, 2, "/bin/true", vec![], &lib)
        .unwrap_or_else(|e| panic!("cdi spec: {e}"));
    let mut config = gantry::config::Config::default();
    config.devices.cdi_spec_dirs = vec![cdi];
    config.devices.dev_root = dev;
    let bundle = host.path().join("bundle");
    let _ = std::fs::create_dir_all(bundle.join("rootfs"));
    let strategy = prop_oneof![json_mutated(seeds.clone()), mutated(seeds)];
    fuzz("spec", strategy, |data| {
        let path = bundle.join("config.json");
        let _ = std::fs::write(&path, &data);
        let Ok(loaded) = gantry::spec::load(&bundle) else {
            return;
        };
        // Refused (invalid text in a part the typed parse skipped is malformed) or unchanged:
        // nothing to write.
        if let Ok(gantry::spec::Edited { write: Some(bytes), .. }) =
            gantry::spec::edit_for_create(&bundle, loaded, &config, std::path::Path::new("/run/no-listener"))
        {
            gantry::spec::write(&bundle, &bytes).unwrap_or_else(|e| panic!("write after edit: {e}"));
            let again = std::fs::read(&path).unwrap_or_default();
            assert!(
                gantry::spec::load(&bundle).is_ok(),
                "the saved spec does not load: {}",
                String::from_utf8_lossy(&again)
            );
        }
    });
}
