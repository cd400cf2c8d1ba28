//! Structured logs (JSON lines via slog) into the bundle's `log` FIFO, which containerd and
//! CRI-O copy into their own logs. Writing never blocks the shim: the FIFO is non-blocking and
//! each line goes out in one `write`; a line that does not fit (stalled reader) is dropped, and
//! a vanished reader only costs log lines (SIGPIPE is ignored). No logging thread: a second
//! thread costs every daemon its stack and its own malloc arena.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use slog::{o, Drain, Level, Logger};

/// Opens `<bundle>/log` for non-blocking writing. Read-write, as containerd opens its end: a
/// FIFO opened so never waits for, nor is refused for lack of, a reader. CRI-O opens its reader
/// while `start` runs, and a daemon that opened write-only before it did got ENXIO and lost
/// every line; now lines wait in the pipe (up to its size) for the reader.
pub fn open_log_fifo(bundle: &Path) -> Option<LineSink<std::fs::File>> {
    // Never through a planted link: the log is the engine's FIFO or nothing.
    let f = crate::files::open_rw_nofollow(&bundle.join("log"), libc::O_NONBLOCK).ok()?;
    Some(LineSink::new(f))
}

/// Collects one JSON line and writes it with a single `write` at the newline, so a line is
/// either delivered whole or dropped whole; errors (EAGAIN, EPIPE) only drop the line.
pub struct LineSink<W: Write> {
    out: W,
    line: Vec<u8>,
}

impl<W: Write> LineSink<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            line: Vec::with_capacity(512),
        }
    }
}

impl<W: Write> Write for LineSink<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        if let Some(end) = self.line.iter().rposition(|b| *b == b'\n') {
            let _ = self.out.write(&self.line[..=end]);
            self.line.drain(..=end);
        }
        // Long lines are never kept around.
        if self.line.len() > 64 * 1024 {
            self.line.clear();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn level(name: &str, debug: bool) -> Level {
    if debug {
        return Level::Debug;
    }
    match name {
        "debug" => Level::Debug,
        "warn" => Level::Warning,
        "error" => Level::Error,
        _ => Level::Info,
    }
}

/// A JSON logger over `out`, filtered at `level`, tagged with the daemon's identity.
pub fn logger<W: Write + Send + 'static>(out: W, level: Level, namespace: &str) -> Logger {
    let json = slog_json::Json::new(out)
        .add_key_value(o!(
            "time" => slog::PushFnValue(|_, ser| ser.emit(rfc3339(std::time::SystemTime::now(), Fraction::Nanos))),
            "level" => slog::FnValue(|r| r.level().as_str()),
            "msg" => slog::PushFnValue(|r, ser| ser.emit(r.msg())),
        ))
        .build()
        .ignore_res();
    let drain = Mutex::new(json.filter_level(level)).ignore_res();
    Logger::root(
        drain,
        o!("runtime" => "io.containerd.gantry.v2", "namespace" => namespace.to_string()),
    )
}

/// A logger that discards everything (probes, `start`, tests).
pub fn discard() -> Logger {
    Logger::root(slog::Discard, o!())
}

/// Routes the `log` facade (used by some dependencies) into slog.
pub fn bridge_log_facade(log: &Logger) {
    let _ = slog_stdlog::init();
    std::mem::forget(slog_scope::set_global_logger(log.clone()));
}

/// Sub-second digits of an [`rfc3339`] timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fraction {
    /// Microseconds: the event log's precision.
    Micros,
    /// Nanoseconds: containerd's log lines (Go's RFC3339Nano, with trailing zeros kept).
    Nanos,
}

/// The one timestamp formatter of the daemon: `YYYY-MM-DDTHH:MM:SS.fffZ` in UTC, by
/// civil-from-days (H. Hinnant). The `time` crate is in the tree but its formatting feature
/// would add code to every daemon for two call sites.
pub fn rfc3339(t: std::time::SystemTime, fraction: Fraction) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    let (h, min, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    match fraction {
        Fraction::Micros => format!(
            "{y:04}-{m:02}-{day:02}T{h:02}:{min:02}:{s:02}.{:06}Z",
            d.subsec_micros()
        ),
        Fraction::Nanos => format!("{y:04}-{m:02}-{day:02}T{h:02}:{min:02}:{s:02}.{:09}Z", d.subsec_nanos()),
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn whole_lines_in_one_write() {
        #[derive(Default)]
        struct Writes(Vec<Vec<u8>>);
        impl Write for Writes {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.push(b.to_vec());
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = LineSink::new(Writes::default());
        for part in [&b"{\"a\":"[..], b"1}\n{\"b\"", b":2}\n"] {
            sink.write_all(part).unwrap();
        }
        assert_eq!(sink.out.0, vec![b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]);
    }

    #[test]
    fn a_stalled_fifo_drops_lines_instead_of_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let sink = open_log_fifo(dir.path()).unwrap();
        let flags = nix::fcntl::fcntl(sink.out.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert!(flags & libc::O_NONBLOCK != 0, "a blocking write would stall the daemon");
        let log = logger(sink, Level::Info, "ns");
        // Far more than a pipe holds, with nobody reading: the loop returning at all shows no
        // write blocked; what the pipe got shows lines were dropped whole, not cut.
        for i in 0..5000 {
            slog::info!(log, "filling the pipe"; "i" => i, "pad" => "x".repeat(100));
        }
        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut reader, &mut got);
        let lines: Vec<&[u8]> = got.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        assert!(!lines.is_empty() && lines.len() < 5000, "{} lines", lines.len());
        for l in &lines {
            serde_json::from_slice::<serde_json::Value>(l).expect("a whole JSON line");
        }
    }

    #[test]
    fn lines_written_before_the_reader_opens_reach_it() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let sink = open_log_fifo(dir.path()).expect("opened with no reader yet");
        let log = logger(sink, Level::Info, "ns");
        slog::info!(log, "serving"; "id" => "c1");
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let mut got = vec![0u8; 4096];
        let n = reader.read(&mut got).unwrap();
        let text = String::from_utf8_lossy(&got[..n]);
        assert!(
            text.contains("\"msg\":\"serving\"") && text.contains("\"id\":\"c1\""),
            "{text}"
        );
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        use std::time::{Duration, SystemTime};
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_796_080_471, 123_456_789);
        assert_eq!(rfc3339(t, Fraction::Micros), "2026-11-30T23:14:31.123456Z");
        assert_eq!(rfc3339(t, Fraction::Nanos), "2026-11-30T23:14:31.123456789Z");
        let epoch = rfc3339(SystemTime::UNIX_EPOCH, Fraction::Micros);
        assert_eq!(epoch, "1970-01-01T00:00:00.000000Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap, Fraction::Micros), "2000-02-29T00:00:00.000000Z");
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }
}
