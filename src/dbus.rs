//! The few D-Bus method calls gantry makes to systemd on the system bus: the sandbox fast
//! path's `StartTransientUnit`, and the installer's `RestartUnit`, `GetUnit` and the unit's
//! `ActiveState`. Little-endian messages over a unix socket, `EXTERNAL` authentication by uid,
//! one call answered at a time, every read bounded by one deadline.
//!
//! Hand-written rather than a crate: zbus brings some 40 crates (its own executor or tokio
//! glue, zvariant, serde_repr, enumflags2), the `dbus` crate links libdbus, which the static
//! binary would then carry; these four calls need a writer, a header reader and one string.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the system bus listens: `DBUS_SYSTEM_BUS_ADDRESS` (`unix:path=...`) or the default.
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

/// An authenticated connection that has said `Hello`.
pub struct Connection {
    stream: UnixStream,
    until: Instant,
    serial: u32,
}

impl Connection {
    /// Connects to the bus at `path`; every later read waits at most until `until`.
    pub fn open(path: &Path, until: Instant) -> Result<Self, String> {
        let stream = UnixStream::connect(path).map_err(|e| format!("connect: {e}"))?;
        let mut conn = Connection {
            stream,
            until,
            serial: 1,
        };
        conn.bound()?;
        let uid = nix::unistd::getuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        conn.stream
            .write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())
            .map_err(|e| format!("auth: {e}"))?;
        let line = read_line(&mut conn.stream).map_err(|e| format!("auth: {e}"))?;
        if !line.starts_with("OK ") {
            return Err(format!("auth refused: {}", line.trim()));
        }
        let mut out = b"BEGIN\r\n".to_vec();
        out.extend(Call::HELLO.message(1, |_| {}));
        conn.stream.write_all(&out).map_err(|e| format!("send: {e}"))?;
        Ok(conn)
    }

    /// Sends one call and waits for its reply (signals and other replies are skipped). A
    /// D-Bus error comes back as `Err("Name: message")`.
    pub fn call(&mut self, call: &Call, body: impl FnOnce(&mut Writer)) -> Result<Reply, String> {
        self.serial += 1;
        let serial = self.serial;
        self.stream
            .write_all(&call.message(serial, body))
            .map_err(|e| format!("send {}: {e}", call.member))?;
        loop {
            if Instant::now() > self.until {
                return Err(format!("no answer to {}", call.member));
            }
            self.bound()?;
            let reply = read_message(&mut self.stream).map_err(|e| format!("read: {e}"))?;
            if reply.reply_serial != Some(serial) {
                continue;
            }
            if let Some(name) = &reply.error {
                return Err(format!("{}: {name}: {}", call.member, reply.text));
            }
            return Ok(reply);
        }
    }

    fn bound(&self) -> Result<(), String> {
        let rest = self.until.saturating_duration_since(Instant::now());
        self.stream
            .set_read_timeout(Some(rest.max(Duration::from_millis(1))))
            .map_err(|e| e.to_string())
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
pub struct Call<'a> {
    pub destination: &'a str,
    pub path: &'a str,
    pub interface: &'a str,
    pub member: &'a str,
    pub signature: &'a str,
}

impl Call<'_> {
    /// The bus daemon's `Hello`, a connection's first call.
    pub const HELLO: Call<'static> = Call {
        destination: "org.freedesktop.DBus",
        path: "/org/freedesktop/DBus",
        interface: "org.freedesktop.DBus",
        member: "Hello",
        signature: "",
    };

    /// A call to systemd's manager object.
    pub const fn manager<'m>(member: &'m str, signature: &'m str) -> Call<'m> {
        Call {
            destination: "org.freedesktop.systemd1",
            path: "/org/freedesktop/systemd1",
            interface: "org.freedesktop.systemd1.Manager",
            member,
            signature,
        }
    }

    pub fn message(&self, serial: u32, body: impl FnOnce(&mut Writer)) -> Vec<u8> {
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
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn align(&mut self, n: usize) {
        while self.buf.len() % n != 0 {
            self.buf.push(0);
        }
    }
    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend(v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.align(8);
        self.buf.extend(v.to_le_bytes());
    }
    pub fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend(s.as_bytes());
        self.buf.push(0);
    }
    pub fn signature(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend(s.as_bytes());
        self.buf.push(0);
    }
    pub fn variant(&mut self, sig: &str, value: &dyn Fn(&mut Writer)) {
        self.signature(sig);
        value(self);
    }
    /// An array whose elements align to `elem_align`; its length excludes that first padding.
    pub fn array(&mut self, elem_align: usize, elems: impl FnOnce(&mut Writer)) {
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

/// What gantry needs of a received message.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub reply_serial: Option<u32>,
    pub error: Option<String>,
    /// An error's message, or a reply's first string, object path or string variant (the
    /// one value every call gantry makes answers with).
    pub text: String,
}

pub fn read_message(conn: &mut impl Read) -> std::io::Result<Reply> {
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
    parse(&all, 16 + padded).ok_or_else(|| bad("malformed header"))
}

/// Reads the header fields (from offset 16) and the body's first string-like value.
fn parse(msg: &[u8], body_at: usize) -> Option<Reply> {
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
    let mut body_sig = Vec::new();
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
            b"g" => {
                let len = *msg.get(at)? as usize;
                if code == 8 {
                    body_sig = msg.get(at + 1..at + 1 + len)?.to_vec();
                }
                at += 1 + len + 1;
            }
            // A field of a type this reader does not size (none in the spec today): the
            // standard ones seen so far are what there is.
            _ => break,
        }
    }
    reply.text = match body_sig.first() {
        Some(b's' | b'o') => string_at(body_at).map(|(s, _)| s).unwrap_or_default(),
        // A variant holding a string: its signature, then the string.
        Some(b'v') if msg.get(body_at + 1) == Some(&b's') => string_at(body_at + 3).map(|(s, _)| s).unwrap_or_default(),
        _ => String::new(),
    };
    Some(reply)
}

/// Messages as a bus sends them, for tests of gantry's callers.
#[cfg(test)]
pub(crate) mod testing {
    use super::Writer;

    /// A reply or error for `serial`, with a body of signature `sig` written by `body`.
    pub(crate) fn reply(
        kind: u8,
        serial: u32,
        error: Option<&str>,
        sig: &str,
        body: impl FnOnce(&mut Writer),
    ) -> Vec<u8> {
        let mut b = Writer::default();
        body(&mut b);
        let mut w = Writer::default();
        w.buf.extend([b'l', kind, 1, 1]);
        w.u32(b.buf.len() as u32);
        w.u32(9);
        w.array(8, |w| {
            w.align(8);
            w.buf.push(5);
            w.variant("u", &|w| w.u32(serial));
            if let Some(name) = error {
                w.align(8);
                w.buf.push(4);
                w.variant("s", &|w| w.string(name));
            }
            if !sig.is_empty() {
                w.align(8);
                w.buf.push(8);
                w.variant("g", &|w| w.signature(sig));
            }
        });
        w.align(8);
        w.buf.extend(b.buf);
        w.buf
    }
}

#[cfg(test)]
mod tests {
    use super::testing::reply;
    use super::*;

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
        assert_eq!(parse(&m, m.len()), Some(Reply::default()));
    }

    #[test]
    fn replies_and_errors_are_read_from_the_wire() {
        // systemd's answer to Properties.Get (serial 1), as sent on the wire.
        let mut wire: Vec<u8> = b"l\x02\x01\x01\x14\x00\x00\x00\x01\x00\x00\x00\x37\x00\x00\x00".to_vec();
        wire.extend(b"\x05\x01u\x00\x01\x00\x00\x00\x07\x01s\x00\x18\x00\x00\x00org.freedesktop.systemd1\x00");
        wire.extend(b"\x00\x00\x00\x00\x00\x00\x00\x08\x01g\x00\x01v\x00\x00");
        wire.extend(b"\x01s\x00\x00\x0b\x00\x00\x00/gsd-manual\x00");
        wire.resize(16 + 0x38 + 0x14, 0);
        let got = read_message(&mut wire.as_slice()).unwrap();
        assert_eq!(got.reply_serial, Some(1));
        assert_eq!(got.error, None);
        assert_eq!(got.text, "/gsd-manual");

        let err = reply(3, 2, Some("org.freedesktop.systemd1.UnitExists"), "s", |w| {
            w.string("Unit crio-abc.scope already exists.")
        });
        let got = read_message(&mut err.as_slice()).unwrap();
        assert_eq!(got.reply_serial, Some(2));
        assert_eq!(got.error.as_deref(), Some("org.freedesktop.systemd1.UnitExists"));
        assert_eq!(got.text, "Unit crio-abc.scope already exists.");
        let path = reply(2, 3, None, "o", |w| w.string("/org/freedesktop/systemd1/job/42"));
        assert_eq!(
            read_message(&mut path.as_slice()).unwrap().text,
            "/org/freedesktop/systemd1/job/42"
        );
        assert!(read_message(&mut &b"B\x02\x01\x01"[..]).is_err());
    }
}
