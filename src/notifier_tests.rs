use super::*;

fn call(name: &str, pid: u32) -> Call {
    Call {
        syscall: name.into(),
        arch: "x86_64",
        pid,
    }
}

fn counts(lines: &[(Call, u64)]) -> Vec<(&str, u64)> {
    lines.iter().map(|(c, n)| (c.syscall.as_str(), *n)).collect()
}

/// A flood of one call: one line at once, one line per window after it with the rest; the
/// lines' counts add up to every call.
#[tokio::test(start_paused = true)]
async fn a_flood_is_reported_once_a_window_and_every_call_counted() {
    let mut r = Reports::default();
    let mut lines = Vec::new();
    for i in 0..1000u32 {
        lines.extend(r.record(call("unshare", i), Instant::now()));
        tokio::time::advance(Duration::from_millis(3)).await;
    }
    lines.extend(r.due(Instant::now() + REPORT_WINDOW));
    let total: u64 = lines.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 1000);
    // 3 s of calls: a handful of lines, not a thousand.
    assert!(lines.len() <= 8, "{} lines", lines.len());
    assert_eq!(lines[0].1, 1, "the first call is reported at once");
}

#[tokio::test(start_paused = true)]
async fn each_syscall_has_its_own_window_and_a_quiet_window_ends_silently() {
    let mut r = Reports::default();
    let now = Instant::now();
    assert_eq!(counts(&r.record(call("unshare", 1), now)), [("unshare", 1)]);
    assert_eq!(counts(&r.record(call("mount", 1), now)), [("mount", 1)]);
    assert!(r.record(call("mount", 2), now).is_empty());
    assert_eq!(r.next_due(), Some(now + REPORT_WINDOW));
    tokio::time::advance(REPORT_WINDOW).await;
    let held = r.due(Instant::now());
    assert_eq!(counts(&held), [("mount", 1)], "unshare's window held nothing");
    assert_eq!(held[0].0.pid, 2, "the held line names the last caller");
    assert_eq!(r.next_due(), None);
    assert_eq!(counts(&r.record(call("unshare", 3), Instant::now())), [("unshare", 1)]);
}
