//! scripts/image.sh: the fleet installer's OCI image archive, built from the test binary.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

use crate::common::{assert_clean, env, run, text, RUNTIME, SHIM};

const NAME: &str = "docker.io/gantry/installer:it";
const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Starts scripts/image.sh on `binary`, writing the archive to `out`.
fn build(binary: &str, out: &Path) -> Child {
    let mut cmd = Command::new("bash");
    cmd.arg(format!("{REPO}/scripts/image.sh"))
        .args(["--binary", binary, "--name", NAME, "--output"])
        .arg(out)
        .env_remove("SOURCE_DATE_EPOCH");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn finish(child: Child) -> Output {
    ok(child.wait_with_output().unwrap())
}

/// `o`, asserting that its command succeeded.
fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// The value of `key:` in a build's summary.
fn field(o: &Output, key: &str) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    let value = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")).map(str::trim));
    value.unwrap_or_else(|| panic!("no {key} in {}", text(o))).to_string()
}

/// One archive of the test binary, shared by the tests (each build gzips ~150 MiB).
fn built() -> &'static (PathBuf, Output) {
    static BUILT: OnceLock<(PathBuf, Output)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let path = env().dir.join("installer-image.tar");
        (path.clone(), finish(build(SHIM, &path)))
    })
}

/// A rollout pins the image's digest, so the same inputs must give the same bytes; and the
/// layer must hold only the binary and runtime-conf/ (no shell), root-owned, modes and mtimes
/// fixed (no umask or checkout time leaks in).
#[test]
fn installer_image_is_reproducible_and_holds_only_the_payload() {
    let dir = tempfile::tempdir().unwrap();
    let again = build(SHIM, &dir.path().join("again.tar"));
    let (path, first) = built();
    let digest = field(first, "manifest digest");
    assert_eq!(field(&finish(again), "manifest digest"), digest, "a second build");
    let same = std::fs::read(path).unwrap() == std::fs::read(dir.path().join("again.tar")).unwrap();
    assert!(same, "a second build gives other archive bytes");
    // The layer's entries as "MODE OWNER DATE NAME", and what they must be.
    let script = r#"tar -xOf "$1" "blobs/sha256/${2#sha256:}" | tar -tvz | awk '{print $1, $2, $4, $6}'"#;
    let mut cmd = Command::new("sh");
    cmd.env("TZ", "UTC").args(["-c", script, "sh"]).arg(path);
    let list = ok(run(cmd.arg(field(first, "layer digest")))).stdout;
    let find = r"find runtime-conf -type d -printf 'drwxr-xr-x 0/0 1970-01-01 gantry/%p/\n' \
                 -o -printf '-rw-r--r-- 0/0 1970-01-01 gantry/%p\n'";
    let conf = ok(run(Command::new("sh").args(["-c", find]).current_dir(REPO))).stdout;
    let fixed = "drwxr-xr-x 0/0 1970-01-01 gantry/\n-rwxr-xr-x 0/0 1970-01-01 gantry/containerd-shim-gantry-v2\n\
                 drwxr-xr-x 0/0 1970-01-01 host/\ndrwxrwxrwt 0/0 1970-01-01 tmp/\n";
    let sorted = |b: &[u8]| {
        let mut v: Vec<String> = String::from_utf8_lossy(b).lines().map(String::from).collect();
        v.sort();
        v
    };
    let want = [conf, fixed.as_bytes().to_vec()].concat();
    assert_eq!(
        sorted(&list),
        sorted(&want),
        "the layer holds more, less or other entries"
    );
}

/// Nodes get this archive: containerd must import it under its name and run the static binary
/// in it (the image has no libc), and skopeo (which pushes it to registries) must read it.
#[test]
fn installer_image_imports_into_containerd_runs_and_skopeo_reads_it() {
    let (path, built) = built();
    let env = env();
    let ns = env.namespace("image");
    ok(env.ctr(&ns.name, &["images", "import", path.to_str().unwrap()]));
    let names = ok(env.ctr(&ns.name, &["images", "ls", "-q"])).stdout;
    assert!(
        String::from_utf8_lossy(&names).lines().any(|l| l == NAME),
        "not imported"
    );
    let (config, bin) = (ns.config.display(), "/gantry/containerd-shim-gantry-v2");
    let args = format!("run --rm --runtime {RUNTIME} --runtime-config-path {config} {NAME} image-v {bin} -v");
    let o = ok(env.ctr(&ns.name, &args.split(' ').collect::<Vec<_>>()));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Version:"), "{}", text(&o));
    assert_clean(env, &ns);

    let o = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci-archive:{}", path.display()))
        .output();
    let o = ok(o.unwrap_or_else(|e| panic!("skopeo: {e}; run scripts/deps.sh, which installs it")));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        info["Digest"].as_str(),
        Some(field(built, "manifest digest").as_str()),
        "{info}"
    );
    assert!(info["Labels"]["org.opencontainers.image.version"].is_string(), "{info}");
}
