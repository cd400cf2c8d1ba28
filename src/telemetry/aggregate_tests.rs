use super::*;

fn rec(kind: Kind, id: &str) -> Record {
    Record::new(kind, id, "k8s.io", "gantry")
}

/// The sample line `name{labels...} value` whose labels include every `want`, or None.
pub(crate) fn sample(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (head, value) = l.rsplit_once(' ')?;
        let (n, labels) = head.split_once('{').unwrap_or((head, ""));
        let ok = n == name && want.iter().all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
        ok.then(|| value.parse().ok()).flatten()
    })
}

#[test]
fn counters_and_histograms_follow_the_records() {
    let mut a = Aggregator::new(false);
    for id in ["a", "b", "c"] {
        let mut r = rec(Kind::Create, id);
        r.duration_ms = Some(12.0);
        a.observe(&r);
        a.observe(&rec(Kind::Start, id));
    }
    let mut oom = rec(Kind::Exit, "a");
    oom.exit_code = Some(137);
    oom.signal = Some(9);
    oom.oom_killed = Some(true);
    a.observe(&oom);
    let mut killed = rec(Kind::Exit, "b");
    killed.signal = Some(15);
    killed.oom_killed = Some(false);
    a.observe(&killed);
    let mut exec = rec(Kind::Exit, "c");
    exec.exec_id = Some("e1".into());
    exec.exit_code = Some(1);
    a.observe(&exec);
    let mut devs = rec(Kind::DevicesInjected, "c");
    devs.devices = vec![
        "nvidia.com/gpu=0".into(),
        "nvidia.com/gpu=1".into(),
        "dev:/dev/x".into(),
    ];
    a.observe(&devs);
    let mut err = rec(Kind::RuntimeError, "c");
    err.call = Some("exec".into());
    a.observe(&err);
    let mut dropped = rec(Kind::Dropped, "");
    dropped.count = Some(5);
    a.observe(&dropped);
    a.observe_line(b"{not json\n");
    a.observe_line(b"\n");
    let text = a.encode().unwrap();
    let base = [("handler", "gantry"), ("namespace", "k8s.io")];
    assert_eq!(sample(&text, "gantry_containers_created_total", &base), Some(3.0));
    assert_eq!(sample(&text, "gantry_containers_started_total", &base), Some(3.0));
    let exits = |reason, process| sample(&text, "gantry_exits_total", &[("reason", reason), ("process", process)]);
    assert_eq!(exits("oom", "init"), Some(1.0));
    assert_eq!(exits("signal", "init"), Some(1.0));
    assert_eq!(exits("normal", "exec"), Some(1.0));
    assert_eq!(exits("normal", "init"), None);
    assert_eq!(
        sample(&text, "gantry_devices_injected_total", &[("kind", "nvidia.com/gpu")]),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "gantry_runtime_errors_total", &[("call", "exec")]),
        Some(1.0)
    );
    assert_eq!(sample(&text, "gantry_events_dropped_total", &base), Some(5.0));
    assert_eq!(sample(&text, "gantry_event_log_malformed_lines_total", &[]), Some(1.0));
    let op = [("op", "create")];
    assert_eq!(sample(&text, "gantry_request_duration_seconds_count", &op), Some(3.0));
    assert_eq!(
        sample(
            &text,
            "gantry_request_duration_seconds_bucket",
            &[("op", "create"), ("le", "0.01")]
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "gantry_request_duration_seconds_bucket",
            &[("op", "create"), ("le", "0.025")]
        ),
        Some(3.0)
    );
    // "c" still runs (its exec exited, not its init).
    assert_eq!(sample(&text, "gantry_containers_running", &base), Some(1.0));
    assert!(sample(&text, "gantry_build_info", &[("version", env!("CARGO_PKG_VERSION"))]) == Some(1.0));
}

#[test]
fn state_stays_bounded_over_a_day_of_churn() {
    let mut a = Aggregator::new(true);
    for i in 0..(MAX_PODS + 2000) {
        let id = format!("c{i}");
        let mut s = rec(Kind::Start, &id);
        s.pod.pod = Some(format!("pod-{i}"));
        s.pod.pod_namespace = Some("shop".into());
        a.observe(&s);
        let mut e = rec(Kind::Exit, &id);
        e.pod = s.pod.clone();
        a.observe(&e);
        let mut d = rec(Kind::Delete, &id);
        d.pod = s.pod.clone();
        a.observe(&d);
    }
    assert_eq!(a.running_len(), 0);
    assert_eq!(a.pods.len(), MAX_PODS);
    let text = a.encode().unwrap();
    assert_eq!(
        sample(&text, "gantry_exits_total", &[("pod", "_other"), ("reason", "normal")]),
        Some(2000.0)
    );
}

#[test]
fn daemon_gauges_are_replaced_not_summed() {
    let a = Aggregator::new(false);
    let d = |rss| DaemonInfo {
        handler: "gantry".into(),
        rss_bytes: rss,
    };
    a.set_daemons(&[d(1000), d(3000)]);
    a.set_daemons(&[d(2000)]);
    let text = a.encode().unwrap();
    assert_eq!(sample(&text, "gantry_daemons", &[("handler", "gantry")]), Some(1.0));
    assert_eq!(
        sample(&text, "gantry_daemon_resident_memory_bytes", &[("handler", "gantry")]),
        Some(2000.0)
    );
}

#[test]
fn device_kinds() {
    assert_eq!(device_kind("nvidia.com/gpu=all"), "nvidia.com/gpu");
    assert_eq!(device_kind("dev:/dev/nvidia0"), "dev");
    assert_eq!(device_kind("weird"), "unknown");
}

#[test]
fn text_format_names_counter_families_with_total() {
    let mut a = Aggregator::new(false);
    let mut r = rec(Kind::Create, "a");
    r.duration_ms = Some(3.0);
    a.observe(&r);
    let text = openmetrics_to_text(&a.encode().unwrap());
    assert!(
        text.contains("# TYPE gantry_containers_created_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("# HELP gantry_containers_created_total Containers created"),
        "{text}"
    );
    assert!(text.contains("# TYPE gantry_request_duration_seconds histogram\n"));
    assert!(!text.contains("# EOF"));
    assert_eq!(sample(&text, "gantry_containers_created_total", &[]), Some(1.0));
}

/// Lines written by a newer gantry (a node mid-upgrade) are counted apart and folded into
/// nothing; this version's lines, written by an older binary or this one, count as usual.
#[test]
fn lines_of_a_newer_schema_are_skipped_not_misread() {
    let mut a = Aggregator::new(false);
    let line = serde_json::to_vec(&rec(Kind::Create, "a")).unwrap();
    a.observe_line(&line);
    let newer = String::from_utf8(line).unwrap().replace("\"v\":1", "\"v\":2");
    assert!(newer.contains("\"v\":2"), "{newer}");
    a.observe_line(newer.as_bytes());
    let text = a.encode().unwrap();
    assert_eq!(sample(&text, "gantry_containers_created_total", &[]), Some(1.0));
    assert_eq!(
        sample(&text, "gantry_event_log_newer_schema_lines_total", &[]),
        Some(1.0)
    );
    assert_eq!(sample(&text, "gantry_event_log_malformed_lines_total", &[]), Some(0.0));
}
