use super::*;

use std::collections::HashSet;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

fn lines_of(path: &Path, keep: u32) -> Vec<String> {
    let mut all = Vec::new();
    for n in (1..=keep).rev() {
        if let Ok(t) = std::fs::read_to_string(rotated(path, n)) {
            all.extend(t.lines().map(str::to_string));
        }
    }
    if let Ok(t) = std::fs::read_to_string(path) {
        all.extend(t.lines().map(str::to_string));
    }
    all
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop (tests run as root).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn new(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            MsFlags::empty(),
            Some(options),
        )
        .expect("mount tmpfs (tests run as root)");
        Tmpfs(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = umount2(self.0.path(), MntFlags::MNT_DETACH);
    }
}

#[test]
fn lines_are_appended_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut log = EventLog::new(&path, 1 << 20, 2);
    log.append(b"{\"a\":1}\n").unwrap();
    log.append(b"{\"a\":2}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n{\"a\":2}\n");
}

#[test]
fn rotation_keeps_the_newest_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut log = EventLog::new(&path, 100, 2);
    for i in 0..30 {
        log.append(format!("{{\"n\":\"{i:03}\",\"pad\":\"xxxxxxxxxx\"}}\n").as_bytes())
            .unwrap();
    }
    assert!(rotated(&path, 1).exists() && rotated(&path, 2).exists());
    assert!(!rotated(&path, 3).exists(), "more files kept than asked");
    for p in [path.clone(), rotated(&path, 1), rotated(&path, 2)] {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len < 100 + 40, "{} is {len} bytes", p.display());
    }
    // The newest lines survive, in order, each whole.
    let lines = lines_of(&path, 2);
    let last: Vec<_> = lines.iter().rev().take(3).collect();
    assert!(
        last[0].contains("\"n\":\"029\"") && last[2].contains("\"n\":\"027\""),
        "{lines:?}"
    );
    for l in &lines {
        serde_json::from_str::<serde_json::Value>(l).unwrap();
    }
}

/// Four writers (own files, own locks: as separate daemons would be) flood one small log;
/// every line must be found whole exactly once across the rotated files.
#[test]
fn concurrent_writers_rotating_lose_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let (writers, per_writer, keep) = (4, 2500, 1000);
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut log = EventLog::new(&path, 8 * 1024, keep);
                for i in 0..per_writer {
                    let line = format!("{{\"w\":{w},\"i\":{i},\"pad\":\"{}\"}}\n", "y".repeat(i % 97));
                    log.append(line.as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let lines = lines_of(&path, keep);
    let mut seen = HashSet::new();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("split line {l:?}: {e}"));
        assert!(
            seen.insert((v["w"].as_u64().unwrap(), v["i"].as_u64().unwrap())),
            "twice: {l}"
        );
    }
    assert_eq!(seen.len(), writers * per_writer);
    // About 1 MiB through an 8 KiB log: ~120 rotations uncontended; writers finding the lock
    // busy skip theirs (nobody waits), so under load far fewer happen. Ten show it rotated
    // again and again while lines kept arriving.
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert!(
        rotated(&path, 10).exists(),
        "the flood did not rotate much: {files} files"
    );
}

#[test]
fn missing_directory_fails_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    // The last level alone is created (as /var/log/gantry is)...
    let one = dir.path().join("gantry").join("events.jsonl");
    EventLog::new(&one, 1 << 20, 1).append(b"{}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&one).unwrap(), "{}\n");
    // ...a path missing more than that is not.
    let path = dir.path().join("not-yet").join("deeper").join("events.jsonl");
    let mut log = EventLog::new(&path, 1 << 20, 1);
    assert!(matches!(log.append(b"x\n"), Err(LogError::Open { .. })));
    // Retried at most once per backoff interval.
    assert!(matches!(log.append(b"x\n"), Err(LogError::Deferred { .. })));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::thread::sleep(REOPEN_BACKOFF + Duration::from_millis(50));
    log.append(b"{}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
}

#[test]
fn full_disk_is_an_error_and_a_broken_line_is_never_glued() {
    assert!(matches!(
        EventLog::new(Path::new("/dev/full"), 1 << 20, 1).append(b"x\n"),
        Err(LogError::Write { .. })
    ));
    let fs = Tmpfs::new("size=8k");
    let path = fs.path().join("events.jsonl");
    let mut log = EventLog::new(&path, 1 << 20, 1);
    let line = format!("{{\"pad\":\"{}\"}}\n", "z".repeat(3000));
    let mut failed = 0;
    for _ in 0..5 {
        if log.append(line.as_bytes()).is_err() {
            failed += 1;
        }
    }
    assert!(failed >= 2, "an 8 KiB tmpfs took five 3 KiB lines");
    // Whatever reached the disk is whole lines or fragments on lines of their own.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.lines().any(|l| l == line.trim_end()),
        "no whole line in {} bytes",
        text.len()
    );
    // Space again after a short write: the next line starts on a line of its own.
    let fs2 = Tmpfs::new("size=4k");
    let p2 = fs2.path().join("e.jsonl");
    let mut log3 = EventLog::new(&p2, 1 << 20, 1);
    let big = format!("{{\"pad\":\"{}\"}}\n", "q".repeat(6000));
    assert!(matches!(log3.append(big.as_bytes()), Err(LogError::Short { .. })));
    std::fs::write(&p2, "partial").unwrap();
    log3.append(b"{\"ok\":2}\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p2).unwrap(), "partial\n{\"ok\":2}\n");
}

#[test]
fn read_only_file_is_an_error_not_a_panic() {
    let fs = Tmpfs::new("size=64k");
    let path = fs.path().join("events.jsonl");
    std::fs::write(&path, "").unwrap();
    mount(
        None::<&str>,
        fs.path(),
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    let mut log = EventLog::new(&path, 1 << 20, 1);
    let e = log.append(b"{}\n").unwrap_err();
    assert!(e.to_string().contains("Read-only"), "{e}");
}

/// Set in the child processes of [`separate_processes_rotating_lose_no_line`].
const WRITER_ENV: &str = "GANTRY_TEST_LOG_WRITER";

/// Not a test of its own: the body of one writer process (a no-op unless [`WRITER_ENV`] is set).
#[test]
fn writer_process() {
    let Ok(spec) = std::env::var(WRITER_ENV) else { return };
    let mut parts = spec.splitn(3, ':');
    let (w, n, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
    let n: usize = n.parse().unwrap();
    let mut log = EventLog::new(Path::new(path), 4096, 100);
    for i in 0..n {
        let line = format!("{{\"w\":{w},\"i\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 61));
        log.append(line.as_bytes()).unwrap();
    }
}

/// Daemons are processes: three of them flood one small log, each rotating when it sees the
/// file full; every line is found whole, exactly once.
#[test]
fn separate_processes_rotating_lose_no_line() {
    // The reaper's tests wait for any child: they must not take these writers' exits.
    let _children = crate::sys::test_children_lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let (writers, per_writer) = (3u64, 3000u64);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..writers)
        .map(|w| {
            std::process::Command::new(&exe)
                .args(["--exact", "telemetry::log::tests::writer_process", "--test-threads=1"])
                .env(WRITER_ENV, format!("{w}:{per_writer}:{}", path.display()))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let mut seen = HashSet::new();
    for l in lines_of(&path, 100) {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("split line {l:?}: {e}"));
        assert!(
            seen.insert((v["w"].as_u64().unwrap(), v["i"].as_u64().unwrap())),
            "twice: {l}"
        );
    }
    assert_eq!(seen.len() as u64, writers * per_writer);
    assert!(rotated(&path, 20).exists(), "the flood did not rotate much");
}
