//! The pause container's scope unit, started over the system D-Bus as runc's systemd driver
//! starts it: `StartTransientUnit(prefix-name.scope, "replace", props, [])` with the init's pid,
//! the parent slice, `Delegate` and the accounting properties, then a wait until the kernel
//! shows the pid in the scope.
//!
//! Why not libcgroups' `add_task` for this one call: it polls for the pid every 20 ms, which
//! was 20 of the 29 ms a pause container's start took with the systemd driver; here the wait
//! polls `/proc/<pid>/cgroup` every 100 µs. Limits and everything after the start still go
//! through libcgroups' systemd manager. Only a D-Bus daemon's socket is used (the system bus,
//! as on systemd hosts); without one the fast path leaves the container to runc.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cgroup::{self, err, CgroupError, SystemdUnit};

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

/// Where the system bus listens: `DBUS_SYSTEM_BUS_ADDRESS` (`unix:path=...`) or the default.
/// The daemon passes its `DBUS_SYSTEM_BUS_ADDRESS` on to the init, so both see the same bus.
pub fn system_bus() -> Option<PathBuf> {
    let from_env = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok().and_then(|a| {
        a.split(';').find_map(|one| {
            one.strip_prefix("unix:path=")
                .map(|p| p.split(',').next().unwrap_or(p).to_string())
        })
    });
    let path = PathBuf::from(from_env.unwrap_or_else(|| "/run/dbus/system_bus_socket".into()));
    path.exists().then_some(path)
}

/// Starts `unit`'s scope in `slice` with `pid` in it and waits until the pid is there; returns
/// the scope's cgroup2 directory.
pub fn start_scope(
    unit: &SystemdUnit,
    slice: &str,
    pid: u32,
    extra: &[(String, Property)],
    timeout: Duration,
) -> Result<PathBuf, CgroupError> {
    let until = Instant::now() + timeout;
    let bus = system_bus().ok_or_else(|| err(Path::new("/run/dbus/system_bus_socket"), "no system D-Bus socket"))?;
    let fail = |why: String| err(&bus, why);
    let mut conn = UnixStream::connect(&bus).map_err(|e| fail(format!("connect: {e}")))?;
    // Every read waits at most until the one deadline.
    let left = |conn: &UnixStream| {
        let rest = until.saturating_duration_since(Instant::now());
        conn.set_read_timeout(Some(rest.max(Duration::from_millis(1))))
    };
    left(&conn).map_err(|e| fail(e.to_string()))?;
    let uid = nix::unistd::getuid().as_raw().to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    conn.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())
        .map_err(|e| fail(format!("auth: {e}")))?;
    let line = read_line(&mut conn).map_err(|e| fail(format!("auth: {e}")))?;
    if !line.starts_with("OK ") {
        return Err(fail(format!("auth refused: {}", line.trim())));
    }
    let start = Call {
        destination: "org.freedesktop.systemd1",
        path: "/org/freedesktop/systemd1",
        interface: "org.freedesktop.systemd1.Manager",
        member: "StartTransientUnit",
        signature: "ssa(sv)a(sa(sv))",
    };
    let slice = if slice.is_empty() { "system.slice" } else { slice };
    let mut out = b"BEGIN\r\n".to_vec();
    out.extend(Call::HELLO.message(1, |_| {}));
    out.extend(start.message(2, |w| scope_request(w, unit, slice, pid, extra)));
    conn.write_all(&out).map_err(|e| fail(format!("send: {e}")))?;
    loop {
        if Instant::now() > until {
            return Err(fail(format!(
                "no answer to StartTransientUnit {} in {timeout:?}",
                unit.scope
            )));
        }
        left(&conn).map_err(|e| fail(e.to_string()))?;
        let reply = read_message(&mut conn).map_err(|e| fail(format!("read: {e}")))?;
        if reply.reply_serial != Some(2) {
            continue;
        }
        if let Some(name) = reply.error {
            return Err(fail(format!(
                "StartTransientUnit {}: {name}: {}",
                unit.scope, reply.text
            )));
        }
        break;
    }
    wait_in_scope(pid, &unit.scope, until).map_err(|why| err(Path::new(&format!("/proc/{pid}/cgroup")), why))
}

/// The request's body: runc's properties for a container scope.
fn scope_request(w: &mut Writer, unit: &SystemdUnit, slice: &str, pid: u32, extra: &[(String, Property)]) {
    w.string(&unit.scope);
    w.string("replace");
    w.array(8, |w| {
        let prop = |w: &mut Writer, name: &str, value: &dyn Fn(&mut Writer)| {
            w.align(8);
            w.string(name);
            value(w);
        };
        let text = |v: String| move |w: &mut Writer| w.variant("s", &|w: &mut Writer| w.string(&v));
        let flag = |v: bool| move |w: &mut Writer| w.variant("b", &|w: &mut Writer| w.u32(v as u32));
        prop(w, "Description", &text(format!("libcontainer container {}", unit.name)));
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

fn read_line(conn: &mut UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") && line.len() < 512 {
        conn.read_exact(&mut byte)?;
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// A method call's header fields.
struct Call<'a> {
    destination: &'a str,
    path: &'a str,
    interface: &'a str,
    member: &'a str,
    signature: &'a str,
}

impl Call<'_> {
    /// The bus daemon's `Hello`, a connection's first call.
    const HELLO: Call<'static> = Call {
        destination: "org.freedesktop.DBus",
        path: "/org/freedesktop/DBus",
        interface: "org.freedesktop.DBus",
        member: "Hello",
        signature: "",
    };

    fn message(&self, serial: u32, body: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut b = Writer::default();
        body(&mut b);
        let mut w = Writer::default();
        w.buf.extend([b'l', 1, 0, 1]);
        w.u32(b.buf.len() as u32);
        w.u32(serial);
        w.array(8, |w| {
            let field = |w: &mut Writer, code: u8, sig: &str, value: &dyn Fn(&mut Writer)| {
                w.align(8);
                w.buf.push(code);
                w.variant(sig, value);
            };
            field(w, 1, "o", &|w| w.string(self.path));
            field(w, 2, "s", &|w| w.string(self.interface));
            field(w, 3, "s", &|w| w.string(self.member));
            field(w, 6, "s", &|w| w.string(self.destination));
            if !self.signature.is_empty() {
                field(w, 8, "g", &|w| w.signature(self.signature));
            }
        });
        w.align(8);
        w.buf.extend(b.buf);
        w.buf
    }
}

/// D-Bus marshalling (little-endian), offsets relative to the message start. A body is built
/// on its own: it starts 8-aligned, so its alignment is the same there.
#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn align(&mut self, n: usize) {
        while self.buf.len() % n != 0 {
            self.buf.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend(v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.align(8);
        self.buf.extend(v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend(s.as_bytes());
        self.buf.push(0);
    }
    fn signature(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend(s.as_bytes());
        self.buf.push(0);
    }
    fn variant(&mut self, sig: &str, value: &dyn Fn(&mut Writer)) {
        self.signature(sig);
        value(self);
    }
    /// An array whose elements align to `elem_align`; its length excludes that first padding.
    fn array(&mut self, elem_align: usize, elems: impl FnOnce(&mut Writer)) {
        self.align(4);
        let at = self.buf.len();
        self.buf.extend([0; 4]);
        self.align(elem_align);
        let start = self.buf.len();
        elems(self);
        let len = (self.buf.len() - start) as u32;
        self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// What the fast path needs of a received message.
#[derive(Debug, Default, PartialEq)]
struct Reply {
    reply_serial: Option<u32>,
    error: Option<String>,
    /// An error's message (its first string argument).
    text: String,
}

fn read_message(conn: &mut impl Read) -> std::io::Result<Reply> {
    let mut fixed = [0u8; 16];
    conn.read_exact(&mut fixed)?;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    if fixed[0] != b'l' {
        return Err(bad("not a little-endian message"));
    }
    let word = |at: usize| u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]]) as usize;
    let (body_len, fields_len) = (word(4), word(12));
    if body_len > 1 << 26 || fields_len > 1 << 26 {
        return Err(bad("message too long"));
    }
    let padded = (16 + fields_len).div_ceil(8) * 8 - 16;
    let mut rest = vec![0u8; padded + body_len];
    conn.read_exact(&mut rest)?;
    let mut all = fixed.to_vec();
    all.extend(rest);
    parse(&all, 16 + padded, fixed[1] == 3).ok_or_else(|| bad("malformed header"))
}

/// Reads the header fields (from offset 16) and, for an error, its message.
fn parse(msg: &[u8], body_at: usize, is_error: bool) -> Option<Reply> {
    let u32_at = |at: usize| {
        msg.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let string_at = |at: usize| -> Option<(String, usize)> {
        let at = at.div_ceil(4) * 4;
        let len = u32_at(at)? as usize;
        let end = at.checked_add(4)?.checked_add(len)?;
        let s = msg.get(at + 4..end)?;
        Some((String::from_utf8_lossy(s).into_owned(), end + 1))
    };
    let fields_end = 16 + u32_at(12)? as usize;
    let mut reply = Reply::default();
    let mut at = 16;
    while at < fields_end {
        at = at.div_ceil(8) * 8;
        let code = *msg.get(at)?;
        let sig_len = *msg.get(at + 1)? as usize;
        let sig = msg.get(at + 2..at + 2 + sig_len)?.to_vec();
        at += 2 + sig_len + 1;
        match sig.as_slice() {
            b"u" => {
                at = at.div_ceil(4) * 4;
                if code == 5 {
                    reply.reply_serial = u32_at(at);
                }
                at += 4;
            }
            b"s" | b"o" => {
                let (s, next) = string_at(at)?;
                if code == 4 {
                    reply.error = Some(s);
                }
                at = next;
            }
            b"g" => at += 1 + *msg.get(at)? as usize + 1,
            // A field of a type this reader does not size (none in the spec today): the
            // standard ones seen so far are what there is.
            _ => break,
        }
    }
    if is_error {
        reply.text = string_at(body_at).map(|(s, _)| s).unwrap_or_default();
    }
    Some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> SystemdUnit {
        SystemdUnit {
            name: "abc".into(),
            scope: "crio-abc.scope".into(),
        }
    }

    #[test]
    fn a_call_is_marshalled_as_the_spec_lays_it_out() {
        let m = Call::HELLO.message(7, |_| {});
        assert_eq!(&m[..4], b"l\x01\x00\x01");
        assert_eq!(&m[4..12], &[0, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(m.len() % 8, 0);
        // Its own header parses back: four fields, the path first.
        let fields = u32::from_le_bytes([m[12], m[13], m[14], m[15]]) as usize;
        assert_eq!(16 + fields.div_ceil(8) * 8, m.len());
        assert_eq!(&m[16..20], b"\x01\x01o\x00");
        assert_eq!(&m[24..45], b"/org/freedesktop/DBus");
        assert_eq!(parse(&m, m.len(), false), Some(Reply::default()));
    }

    #[test]
    fn the_scope_request_holds_runcs_properties_and_the_pid() {
        let mut w = Writer::default();
        scope_request(&mut w, &unit(), "kubepods-pod1.slice", 4242, &[]);
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
        scope_request(&mut w, &unit(), "", 1, &extra);
        let at = w.buf.windows(15).position(|x| x == b"TimeoutStopUSec").unwrap();
        let sig = at + 16;
        assert_eq!(&w.buf[sig..sig + 3], b"\x01t\x00");
        let value = (sig + 3).div_ceil(8) * 8;
        assert_eq!(&w.buf[value..value + 8], &7u64.to_le_bytes());
        assert!(String::from_utf8_lossy(&w.buf).contains("inactive-or-failed"));
    }

    #[test]
    fn replies_and_errors_are_read_from_the_wire() {
        // systemd's answer to Properties.Get (serial 1), as sent on the wire.
        let mut wire: Vec<u8> = b"l\x02\x01\x01\x14\x00\x00\x00\x01\x00\x00\x00\x37\x00\x00\x00".to_vec();
        wire.extend(b"\x05\x01u\x00\x01\x00\x00\x00\x07\x01s\x00\x18\x00\x00\x00org.freedesktop.systemd1\x00");
        wire.extend(b"\x00\x00\x00\x00\x00\x00\x00\x08\x01g\x00\x01v\x00\x00");
        wire.extend(b"\x01s\x00\x00\x0b\x00\x00\x00/gsd-manual\x00");
        wire.resize(16 + 0x38 + 0x14, 0);
        let reply = read_message(&mut wire.as_slice()).unwrap();
        assert_eq!(reply.reply_serial, Some(1));
        assert_eq!(reply.error, None);

        // An error for serial 2, built here with its message as the body.
        let mut body = Writer::default();
        body.string("Unit crio-abc.scope already exists.");
        let mut w = Writer::default();
        w.buf.extend([b'l', 3, 1, 1]);
        w.u32(body.buf.len() as u32);
        w.u32(9);
        w.array(8, |w| {
            w.align(8);
            w.buf.push(5);
            w.variant("u", &|w| w.u32(2));
            w.align(8);
            w.buf.push(4);
            w.variant("s", &|w| w.string("org.freedesktop.systemd1.UnitExists"));
        });
        w.align(8);
        w.buf.extend(body.buf);
        let reply = read_message(&mut w.buf.as_slice()).unwrap();
        assert_eq!(reply.reply_serial, Some(2));
        assert_eq!(reply.error.as_deref(), Some("org.freedesktop.systemd1.UnitExists"));
        assert_eq!(reply.text, "Unit crio-abc.scope already exists.");
        assert!(read_message(&mut &b"B\x02\x01\x01"[..]).is_err());
    }
}
