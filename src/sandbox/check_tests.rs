use std::collections::HashMap;

use serde_json::{json, Value};

use super::*;

/// A pause container's spec as CRI-O writes it (trimmed): namespaces from pinns, cgroupfs.
fn pause_spec() -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 65535, "gid": 65535},
            "args": ["/pause"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"], "effective": ["CAP_CHOWN"]},
            "noNewPrivileges": true,
            "oomScoreAdj": -998
        },
        "root": {"path": "/var/lib/containers/storage/overlay/x/merged", "readonly": true},
        "hostname": "pod",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/shm", "type": "bind", "source": "/run/containers/storage/x/shm", "options": ["rw", "bind"]},
            {"destination": "/etc/resolv.conf", "source": "/run/x/resolv.conf", "options": ["ro", "bind", "nodev", "nosuid", "noexec"]}
        ],
        "annotations": {"io.kubernetes.cri-o.ContainerType": "sandbox"},
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}], "cpu": {"shares": 2}},
            "cgroupsPath": "/kubepods/besteffort/pod1/crio-abc",
            "namespaces": [
                {"type": "pid"},
                {"type": "network", "path": "/var/run/netns/x"},
                {"type": "ipc", "path": "/var/run/ipcns/x"},
                {"type": "uts", "path": "/var/run/utsns/x"},
                {"type": "mount"}
            ],
            "seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64"],
                        "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]},
            "maskedPaths": ["/proc/kcore"],
            "readonlyPaths": ["/proc/sys"]
        }
    })
}

fn reason(doc: &Value) -> String {
    check(doc, false).err().map(|f| f.0).unwrap_or_default()
}

#[test]
fn a_crio_pause_spec_takes_the_fast_path() {
    assert_eq!(check(&pause_spec(), false), Ok(()));
}

#[test]
fn sandboxes_and_pause_programs_are_recognised() {
    let ann = |k: &str, v: &str| HashMap::from([(k.to_string(), v.to_string())]);
    assert!(is_sandbox(&ann("io.kubernetes.cri-o.ContainerType", "sandbox")));
    assert!(is_sandbox(&ann("io.kubernetes.cri.container-type", "sandbox")));
    assert!(!is_sandbox(&ann("io.kubernetes.cri.container-type", "container")));
    assert!(!is_sandbox(&HashMap::new()));
    assert!(is_pause(&pause_spec()));
    for args in [
        json!(["/bin/sleep", "1"]),
        json!(["/pause", "-v"]),
        json!([]),
        json!(["/pausex"]),
    ] {
        let mut doc = pause_spec();
        doc["process"]["args"] = args.clone();
        assert!(!is_pause(&doc), "{args}");
    }
    let mut doc = pause_spec();
    doc["process"]["args"] = json!(["pause"]);
    assert!(is_pause(&doc));
}

#[test]
fn the_systemd_driver_takes_slice_prefix_name_paths_where_the_host_allows_it() {
    let no = |_: &str| false;
    let with = |path: &str, driver| {
        let mut doc = pause_spec();
        doc["linux"]["cgroupsPath"] = json!(path);
        check_with(&doc, driver, no).err().map(|f| f.0)
    };
    let unusable = Driver::SystemdUnusable("the systemd cgroup driver on a cgroup v1 host");
    assert_eq!(
        with("kubepods-besteffort-pod1.slice:crio:abc", unusable).as_deref(),
        Some("the systemd cgroup driver on a cgroup v1 host")
    );
    for good in [
        "kubepods-besteffort-pod1.slice:crio:abc",
        ":cri-containerd:abc",
        "system.slice:x:y",
    ] {
        assert_eq!(with(good, Driver::Systemd), None, "{good}");
    }
    for bad in [
        "/kubepods/pod1/abc",
        "kubepods.slice:crio",
        "kubepods.slice:crio:a:b",
        "kubepods.slice:crio:",
        "kubepods.slice::abc",
        "kubepods.slice:crio:pod.slice",
        "kubepods:crio:abc",
        ".slice:crio:abc",
        "a/b.slice:crio:abc",
        "kubepods.slice:crio:..",
        "kubepods.slice:cr/io:abc",
    ] {
        assert!(
            with(bad, Driver::Systemd).is_some_and(|r| r.contains("slice:prefix:name")),
            "{bad}"
        );
    }
    // CRI-O's CollectMode annotation is sent with the scope; a form runc reads that the fast
    // path does not write goes to runc.
    let with_annotation = |key: &str, value: &str| {
        let mut doc = pause_spec();
        doc["linux"]["cgroupsPath"] = json!("kubepods-pod1.slice:crio:abc");
        doc["annotations"][key] = json!(value);
        check_with(&doc, Driver::Systemd, no).err().map(|f| f.0)
    };
    assert_eq!(
        with_annotation("org.systemd.property.CollectMode", "'inactive-or-failed'"),
        None
    );
    assert!(with_annotation("org.systemd.property.CPUWeight", "@t 100").is_some_and(|r| r.contains("CPUWeight")));
    assert!(with_annotation("org.systemd.property.Bad-Name", "true").is_some());
    let unit = super::super::cgroup::systemd_unit(std::path::Path::new("kubepods-pod1.slice:crio:abc")).unwrap();
    assert_eq!((unit.name.as_str(), unit.scope.as_str()), ("abc", "crio-abc.scope"));
}

#[test]
fn host_cgroup_setups_it_does_not_handle_fall_back() {
    if !crate::sandbox::cgroup::host_is_v2() {
        assert!(check(&pause_spec(), true).unwrap_err().0.contains("systemd"));
    }
    for path in [
        "kubepods-besteffort.slice:crio:abc",
        "relative/path",
        "",
        "/../../../../tmp/escape",
        "/kubepods/./pod1/..",
    ] {
        let mut doc = pause_spec();
        doc["linux"]["cgroupsPath"] = json!(path);
        assert!(reason(&doc).contains("cgroupsPath"), "{path}");
    }
}

#[test]
fn each_unhandled_feature_names_itself() {
    type Edit = fn(&mut Value);
    let cases: Vec<(Edit, &str)> = vec![
        (|d| d["hooks"] = json!({"prestart": [{"path": "/bin/true"}]}), "hooks"),
        (|d| d["process"]["terminal"] = json!(true), "terminal"),
        (
            |d| d["process"]["apparmorProfile"] = json!("runtime/default"),
            "AppArmor",
        ),
        (
            |d| d["process"]["selinuxLabel"] = json!("system_u:system_r:container_t:s0"),
            "SELinux",
        ),
        (
            |d| d["linux"]["mountLabel"] = json!("system_u:object_r:container_file_t:s0"),
            "SELinux",
        ),
        (
            |d| d["linux"]["uidMappings"] = json!([{"containerID": 0, "hostID": 1000, "size": 1}]),
            "user namespace",
        ),
        (
            |d| {
                d["linux"]["namespaces"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"type": "user"}))
            },
            "\"user\" namespace",
        ),
        (
            |d| d["linux"]["namespaces"] = json!([{"type": "pid"}]),
            "no new mount namespace",
        ),
        (
            |d| {
                d["linux"]["namespaces"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"type": "mount", "path": "/x"}))
            },
            "existing mount",
        ),
        (
            |d| {
                d["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup"}))
            },
            "\"cgroup\" mount",
        ),
        (
            |d| {
                d["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"destination": "/x", "type": "bind", "source": "/y", "options": ["rbind", "idmap"]}))
            },
            "idmap",
        ),
        (
            |d| {
                d["mounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"destination": "x", "type": "tmpfs", "source": "tmpfs"}))
            },
            "not absolute",
        ),
        (
            |d| d["process"]["capabilities"]["effective"] = json!(["CAP_FUTURE_THING"]),
            "CAP_FUTURE_THING",
        ),
        (
            |d| d["linux"]["seccomp"]["syscalls"][0]["action"] = json!("SCMP_ACT_NOTIFY"),
            "notification",
        ),
        (
            |d| d["linux"]["seccomp"]["listenerPath"] = json!("/run/agent.sock"),
            "linux.seccomp.listenerPath",
        ),
        (|d| d["linux"]["intelRdt"] = json!({"closID": "x"}), "linux.intelRdt"),
        (
            |d| d["linux"]["personality"] = json!({"domain": "LINUX32"}),
            "linux.personality",
        ),
        (
            |d| d["process"]["ioPriority"] = json!({"class": "IOPRIO_CLASS_IDLE"}),
            "process.ioPriority",
        ),
        (
            |d| d["process"]["user"]["username"] = json!("nobody"),
            "process.user.username",
        ),
        (|d| d["vendorThing"] = json!({"x": 1}), "vendorThing"),
    ];
    for (edit, want) in cases {
        let mut doc = pause_spec();
        edit(&mut doc);
        let why = reason(&doc);
        assert!(why.contains(want), "{want:?} not in {why:?}");
    }
}

#[test]
fn empty_values_of_unhandled_fields_are_no_reason() {
    let mut doc = pause_spec();
    doc["hooks"] = json!({});
    doc["process"]["apparmorProfile"] = json!("");
    doc["linux"]["uidMappings"] = json!([]);
    doc["linux"]["intelRdt"] = Value::Null;
    doc["process"]["terminal"] = json!(false);
    assert_eq!(check(&doc, false), Ok(()));
}

#[test]
fn sysctls_and_names_outside_the_containers_namespaces_go_to_runc() {
    let host = |p: &str| p == "/proc/1/ns/net";
    let with = |edit: fn(&mut Value)| {
        let mut doc = pause_spec();
        edit(&mut doc);
        check_with(&doc, Driver::Cgroupfs, host)
    };
    assert_eq!(
        with(
            |d| d["linux"]["sysctl"] = json!({"net.ipv4.ip_forward": "1", "kernel.shm_rmid_forced": "1", "fs.mqueue.msg_max": "20", "kernel.domainname": "x"})
        ),
        Ok(())
    );
    for (edit, want) in [
        (
            (|d| d["linux"]["sysctl"] = json!({"kernel.panic": "1"})) as fn(&mut Value),
            "kernel.panic",
        ),
        (
            |d| d["linux"]["sysctl"] = json!({"kernel.hostname": "x"}),
            "kernel.hostname",
        ),
        (
            |d| {
                d["linux"]["sysctl"] = json!({"net.ipv4.ip_forward": "1"});
                d["linux"]["namespaces"][1]["path"] = json!("/proc/1/ns/net");
            },
            "net.ipv4.ip_forward",
        ),
        (
            |d| {
                d["linux"]["sysctl"] = json!({"kernel.sem": "1 2 3 4"});
                d["linux"]["namespaces"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|n| n["type"] != "ipc");
            },
            "kernel.sem",
        ),
        (
            |d| {
                d["linux"]["namespaces"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|n| n["type"] != "uts")
            },
            "hostname without a UTS",
        ),
    ] {
        let why = with(edit).unwrap_err().0;
        assert!(why.contains(want), "{want:?} not in {why:?}");
    }
}
