//! The pause container's scope unit, started over the system D-Bus as runc's systemd driver
//! starts it: `StartTransientUnit(prefix-name.scope, "replace", props, [])` with the init's pid,
//! the parent slice, `Delegate` and the accounting properties, then a wait until the kernel
//! shows the pid in the scope.
//!
//! Why not libcgroups' `add_task` for this one call: it polls for the pid every 20 ms, which
//! was 20 of the 29 ms a pause container's start took with the systemd driver; here the wait
//! polls `/proc/<pid>/cgroup` every 100 µs. Limits and everything after the start still go
//! through libcgroups' systemd manager. Only a D-Bus daemon's socket is used (the system bus,
//! as on systemd hosts); without one the fast path leaves the container to runc. The wire
//! format is [`crate::dbus`]'s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::{self, err, CgroupError};
use crate::dbus::{Call, Connection, Writer};

/// A unit property given as an `org.systemd.property.<Name>` annotation, in the GVariant text
/// forms runc reads and CRI-O writes (`'inactive-or-failed'`, `uint64 30000000`, `true`,
/// `['crio.service']`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Property {
    Text(String),
    Flag(bool),
    Number(u64),
    Texts(Vec<String>),
}

/// The annotation prefix runc turns into unit properties.
pub const PROPERTY_ANNOTATION: &str = "org.systemd.property.";

/// `value` in one of the forms [`Property`] takes; `None` for anything else (the fast path then
/// leaves the container to runc, which reads every GVariant form).
pub fn parse_property(value: &str) -> Option<Property> {
    let quoted = |s: &str| {
        let inner = s.strip_prefix('\'')?.strip_suffix('\'')?;
        (!inner.contains(['\'', '\\'])).then(|| inner.to_string())
    };
    let v = value.trim();
    match v {
        "true" => return Some(Property::Flag(true)),
        "false" => return Some(Property::Flag(false)),
        _ => {}
    }
    if let Some(n) = v.strip_prefix("uint64 ") {
        return n.trim().parse().ok().map(Property::Number);
    }
    if let Some(list) = v.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
        if list.trim().is_empty() {
            return None;
        }
        return list
            .split(',')
            .map(|e| quoted(e.trim()))
            .collect::<Option<Vec<_>>>()
            .map(Property::Texts);
    }
    quoted(v).map(Property::Text)
}

/// A property name runc would pass on: letters only (`CollectMode`, `TimeoutStopUSec`).
pub fn property_name_ok(name: &str) -> bool {
    !name.is_empty() && name.len() < 64 && name.bytes().all(|b| b.is_ascii_alphabetic())
}

/// The spec's `org.systemd.property.*` annotations as unit properties, by name; `Err` names the
/// first one this module does not send as runc would.
pub fn annotation_properties<'a>(
    annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<Vec<(String, Property)>, String> {
    let mut out = Vec::new();
    for (key, value) in annotations {
        let Some(name) = key.strip_prefix(PROPERTY_ANNOTATION) else {
            continue;
        };
        match parse_property(value) {
            Some(p) if property_name_ok(name) => out.push((name.to_string(), p)),
            _ => return Err(key.clone()),
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

pub use crate::dbus::system_bus;

/// Starts `scope` with its pid in it and waits until the kernel shows the pid there; returns
/// the scope's cgroup2 directory.
pub fn start_scope(scope: &Scope<'_>, timeout: Duration) -> Result<PathBuf, CgroupError> {
    let until = Instant::now() + timeout;
    request_scope(scope, until)?;
    let pid = scope.pid;
    wait_in_scope(pid, scope.unit, until).map_err(|why| err(Path::new(&format!("/proc/{pid}/cgroup")), why))
}

/// A transient scope to start: runc's properties for a container scope, plus `extra`. The
/// pod's daemon asks for one of its own too (`crate::daemon_cgroup`).
pub struct Scope<'a> {
    /// `name.scope`.
    pub unit: &'a str,
    pub description: &'a str,
    /// The parent slice; empty for `system.slice`.
    pub slice: &'a str,
    pub pid: u32,
    pub extra: &'a [(String, Property)],
}

/// `StartTransientUnit` for `scope`, answered by `until`; systemd moves the pid in after it
/// answers.
fn request_scope(scope: &Scope<'_>, until: Instant) -> Result<(), CgroupError> {
    let bus = system_bus().ok_or_else(|| err(Path::new("/run/dbus/system_bus_socket"), "no system D-Bus socket"))?;
    let mut conn = Connection::open(&bus, until).map_err(|why| err(&bus, why))?;
    let start = Call::manager("StartTransientUnit", "ssa(sv)a(sa(sv))");
    conn.call(&start, |w| scope_request(w, scope))
        .map_err(|why| err(&bus, format!("{why} ({})", scope.unit)))?;
    Ok(())
}

/// The request's body: runc's properties for a container scope.
fn scope_request(w: &mut Writer, scope: &Scope<'_>) {
    let Scope {
        unit,
        description,
        slice,
        pid,
        extra,
    } = *scope;
    let slice = if slice.is_empty() { "system.slice" } else { slice };
    w.string(unit);
    w.string("replace");
    w.array(8, |w| {
        let prop = |w: &mut Writer, name: &str, value: &dyn Fn(&mut Writer)| {
            w.align(8);
            w.string(name);
            value(w);
        };
        let text = |v: String| move |w: &mut Writer| w.variant("s", &|w: &mut Writer| w.string(&v));
        let flag = |v: bool| move |w: &mut Writer| w.variant("b", &|w: &mut Writer| w.u32(v as u32));
        prop(w, "Description", &text(description.to_string()));
        prop(w, "Slice", &text(slice.to_string()));
        prop(w, "Delegate", &flag(true));
        for accounting in ["MemoryAccounting", "CPUAccounting", "IOAccounting", "TasksAccounting"] {
            prop(w, accounting, &flag(true));
        }
        prop(w, "DefaultDependencies", &flag(false));
        prop(w, "PIDs", &|w: &mut Writer| {
            w.variant("au", &|w: &mut Writer| w.array(4, |w| w.u32(pid)))
        });
        // The spec's own, after runc's (as runc appends them).
        for (name, value) in extra {
            prop(w, name, &|w: &mut Writer| match value {
                Property::Text(t) => w.variant("s", &|w: &mut Writer| w.string(t)),
                Property::Flag(f) => w.variant("b", &|w: &mut Writer| w.u32(*f as u32)),
                Property::Number(n) => w.variant("t", &|w: &mut Writer| w.u64(*n)),
                Property::Texts(list) => w.variant("as", &|w: &mut Writer| {
                    w.array(4, |w| list.iter().for_each(|t| w.string(t)))
                }),
            });
        }
    });
    w.array(8, |_| {});
}

/// Polls `/proc/<pid>/cgroup` until its cgroup2 path ends in the scope (100 µs at first,
/// backing off to 1 ms).
fn wait_in_scope(pid: u32, scope: &str, until: Instant) -> Result<PathBuf, String> {
    let file = format!("/proc/{pid}/cgroup");
    let suffix = format!("/{scope}");
    let mut pause = Duration::from_micros(100);
    loop {
        let text = crate::proc::cgroup_text(pid as i32).map_err(|e| format!("{file}: {e}"))?;
        if let Some(path) = crate::proc::unified_path(&text).filter(|p| p.ends_with(&suffix)) {
            return cgroup::under_v2_root(path);
        }
        if Instant::now() > until {
            return Err(format!("systemd did not move it into {scope}"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::cgroup::SystemdUnit;

    fn unit() -> SystemdUnit {
        SystemdUnit {
            name: "abc".into(),
            scope: "crio-abc.scope".into(),
        }
    }

    #[test]
    fn the_scope_request_holds_runcs_properties_and_the_pid() {
        let mut w = Writer::default();
        let scope = Scope {
            unit: &unit().scope,
            description: "libcontainer container abc",
            slice: "kubepods-pod1.slice",
            pid: 4242,
            extra: &[],
        };
        scope_request(&mut w, &scope);
        let body = String::from_utf8_lossy(&w.buf).into_owned();
        for want in [
            "crio-abc.scope",
            "replace",
            "libcontainer container abc",
            "kubepods-pod1.slice",
            "Delegate",
            "TasksAccounting",
            "DefaultDependencies",
            "PIDs",
        ] {
            assert!(body.contains(want), "{want}");
        }
        // `au` with one element, 4242, ends the properties; the aux array is empty.
        let at = w.buf.windows(4).position(|x| x == b"\x02au\x00").unwrap() + 4;
        let at = at.div_ceil(4) * 4;
        assert_eq!(&w.buf[at..at + 8], &[4, 0, 0, 0, 0x92, 0x10, 0, 0]);
        let rest = &w.buf[at + 8..];
        assert!(rest.len() >= 4 && rest.iter().all(|b| *b == 0), "{rest:?}");
        assert_eq!(w.buf.len() % 8, 0);
    }

    #[test]
    fn property_annotations_in_the_forms_cri_o_writes() {
        assert_eq!(
            parse_property("'inactive-or-failed'"),
            Some(Property::Text("inactive-or-failed".into()))
        );
        assert_eq!(parse_property("uint64 30000000"), Some(Property::Number(30_000_000)));
        assert_eq!(parse_property("true"), Some(Property::Flag(true)));
        assert_eq!(
            parse_property("['crio.service', 'x.target']"),
            Some(Property::Texts(vec!["crio.service".into(), "x.target".into()]))
        );
        for other in [
            "inactive",
            "'a'b'",
            "uint32 5",
            "uint64 -1",
            "[]",
            "['a', b]",
            "@as []",
            "'\\x'",
        ] {
            assert_eq!(parse_property(other), None, "{other}");
        }
        assert!(property_name_ok("CollectMode") && !property_name_ok("Collect.Mode") && !property_name_ok(""));
        // Marshalled after runc's own, each as its type.
        let extra = [
            ("CollectMode".to_string(), Property::Text("inactive-or-failed".into())),
            ("TimeoutStopUSec".to_string(), Property::Number(7)),
        ];
        let mut w = Writer::default();
        let scope = Scope {
            unit: &unit().scope,
            description: "libcontainer container abc",
            slice: "",
            pid: 1,
            extra: &extra,
        };
        scope_request(&mut w, &scope);
        let at = w.buf.windows(15).position(|x| x == b"TimeoutStopUSec").unwrap();
        let sig = at + 16;
        assert_eq!(&w.buf[sig..sig + 3], b"\x01t\x00");
        let value = (sig + 3).div_ceil(8) * 8;
        assert_eq!(&w.buf[value..value + 8], &7u64.to_le_bytes());
        assert!(String::from_utf8_lossy(&w.buf).contains("inactive-or-failed"));
    }
}
