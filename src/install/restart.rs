//! Restarting an engine after its configuration changed: systemd's `RestartUnit` over the
//! host's system bus (no `nsenter`, no host shell: the installer runs in a container that
//! sees the host's `/run/dbus`), then a wait until the restart job is done and the unit is
//! active again. Engines run as `Type=notify` services, so "active" means "answering".

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::dbus::{Call, Connection};

/// Restarts `unit` and waits until it is active; `Err` says what failed or what state the
/// unit was left in.
pub fn restart_unit(bus: &Path, unit: &str, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    let mut conn = Connection::open(bus, until)?;
    let job = conn
        .call(&Call::manager("RestartUnit", "ss"), |w| {
            w.string(unit);
            w.string("replace");
        })?
        .text;
    // The job object exists until the job finished.
    loop {
        let state = property(&mut conn, &job, "org.freedesktop.systemd1.Job", "State");
        if state.is_err() {
            break;
        }
        if Instant::now() > until {
            return Err(format!("restart of {unit} still running after {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let path = conn.call(&Call::manager("GetUnit", "s"), |w| w.string(unit))?.text;
    let state = property(&mut conn, &path, "org.freedesktop.systemd1.Unit", "ActiveState")?;
    if state != "active" {
        return Err(format!("{unit} is {state} after the restart"));
    }
    Ok(())
}

fn property(conn: &mut Connection, object: &str, interface: &str, name: &str) -> Result<String, String> {
    let get = Call {
        destination: "org.freedesktop.systemd1",
        path: object,
        interface: "org.freedesktop.DBus.Properties",
        member: "Get",
        signature: "ss",
    };
    Ok(conn
        .call(&get, |w| {
            w.string(interface);
            w.string(name);
        })?
        .text)
}

/// Waits until CRI-O's own view of its configuration (`GET /config` on its socket, the
/// HTTP API `crio status config` reads) lists the gantry handler.
pub fn wait_crio_handler(socket: &Path, timeout: Duration) -> Result<(), String> {
    let until = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < until {
        match http_get(socket, "/config") {
            Ok(body) if body.contains("[crio.runtime.runtimes.gantry]") => return Ok(()),
            Ok(_) => last = "its config has no [crio.runtime.runtimes.gantry]".into(),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!("CRI-O at {} did not list gantry: {last}", socket.display()))
}

fn http_get(socket: &Path, path: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dbus::Writer;

    /// A system bus with a systemd that restarts `containerd.service` at once; records the
    /// members called.
    fn fake_bus(dir: &Path, active: &'static str) -> std::thread::JoinHandle<Vec<String>> {
        let listener = std::os::unix::net::UnixListener::bind(dir.join("bus")).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = Vec::new();
            let mut b = [0u8; 1];
            while !line.ends_with(b"\r\n") {
                s.read_exact(&mut b).unwrap();
                line.push(b[0]);
            }
            assert!(line.starts_with(b"\0AUTH EXTERNAL "));
            s.write_all(b"OK 1234\r\n").unwrap();
            let mut begin = [0u8; 7];
            s.read_exact(&mut begin).unwrap();
            assert_eq!(&begin, b"BEGIN\r\n");
            let mut called = Vec::new();
            while let Ok((serial, member)) = read_call(&mut s) {
                let reply =
                    |sig: &str, body: &dyn Fn(&mut Writer)| crate::dbus::testing::reply(2, serial, None, sig, body);
                let out = match member.as_str() {
                    "Hello" => reply("s", &|w| w.string(":1.9")),
                    "RestartUnit" => reply("o", &|w| w.string("/org/freedesktop/systemd1/job/7")),
                    "GetUnit" => reply("o", &|w| {
                        w.string("/org/freedesktop/systemd1/unit/containerd_2eservice")
                    }),
                    "Get" if called.iter().filter(|m| *m == "Get").count() == 0 => {
                        reply("v", &|w| w.variant("s", &|w| w.string("running")))
                    }
                    "Get" if called.last().map(String::as_str) == Some("GetUnit") => {
                        reply("v", &|w| w.variant("s", &|w| w.string(active)))
                    }
                    // The job is gone: it finished.
                    "Get" => crate::dbus::testing::reply(
                        3,
                        serial,
                        Some("org.freedesktop.DBus.Error.UnknownObject"),
                        "s",
                        |w| w.string("Unknown object"),
                    ),
                    other => panic!("unexpected call {other}"),
                };
                called.push(member);
                s.write_all(&out).unwrap();
            }
            called
        })
    }

    /// A call's serial and member, read off the wire.
    fn read_call(s: &mut UnixStream) -> std::io::Result<(u32, String)> {
        let mut fixed = [0u8; 16];
        s.read_exact(&mut fixed)?;
        let word = |at: usize| u32::from_le_bytes(fixed[at..at + 4].try_into().unwrap()) as usize;
        let padded = (16 + word(12)).div_ceil(8) * 8 - 16;
        let mut rest = vec![0u8; padded + word(4)];
        s.read_exact(&mut rest)?;
        let text = String::from_utf8_lossy(&rest).into_owned();
        let member = ["Hello", "RestartUnit", "GetUnit", "Get"]
            .into_iter()
            .find(|m| {
                text.contains(&format!("\u{3}\u{1}s\0{}", char::from(m.len() as u8)))
                    || text.contains(&format!("{m}\0"))
            })
            .unwrap_or("?");
        Ok((word(8) as u32, member.to_string()))
    }

    #[test]
    fn a_restart_waits_for_its_job_and_checks_the_unit_is_active() {
        let dir = tempfile::tempdir().unwrap();
        let bus = fake_bus(dir.path(), "active");
        restart_unit(&dir.path().join("bus"), "containerd.service", Duration::from_secs(30)).unwrap();
        assert_eq!(
            bus.join().unwrap(),
            ["Hello", "RestartUnit", "Get", "Get", "GetUnit", "Get"]
        );

        let dir = tempfile::tempdir().unwrap();
        let bus = fake_bus(dir.path(), "failed");
        let err = restart_unit(&dir.path().join("bus"), "containerd.service", Duration::from_secs(30)).unwrap_err();
        assert!(err.contains("containerd.service is failed"), "{err}");
        drop(bus);
    }
}
