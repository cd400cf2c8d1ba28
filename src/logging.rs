//! Structured logs (JSON lines via slog) into the bundle's `log` FIFO, which containerd and
//! CRI-O copy into their own logs. Writing never blocks the shim: an async drain drops lines
//! when its reader stalls, and a vanished reader only costs log lines (SIGPIPE is ignored).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use slog::{o, Drain, Level, Logger};

/// Opens `<bundle>/log` for writing if someone reads it; otherwise logs go nowhere.
pub fn open_log_fifo(bundle: &Path) -> Option<std::fs::File> {
    let path = bundle.join("log");
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    // Blocking again, so the async drain's thread (not the shim) is what waits on a slow reader.
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).ok()?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) & !nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags)).ok()?;
    Some(f)
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
pub fn logger<W: Write + Send + 'static>(out: W, level: Level, namespace: &str) -> (Logger, slog_async::AsyncGuard) {
    let json = slog_json::Json::new(out)
        .add_key_value(o!(
            "time" => slog::PushFnValue(|_, ser| ser.emit(chrono_like_now())),
            "level" => slog::FnValue(|r| r.level().as_str()),
            "msg" => slog::PushFnValue(|r, ser| ser.emit(r.msg())),
        ))
        .build()
        .ignore_res();
    let (drain, guard) = slog_async::Async::new(json.filter_level(level).fuse())
        .chan_size(64)
        .overflow_strategy(slog_async::OverflowStrategy::Drop)
        .build_with_guard();
    let log = Logger::root(
        drain.fuse(),
        o!("runtime" => "io.containerd.gantry.v2", "namespace" => namespace.to_string()),
    );
    (log, guard)
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

/// RFC 3339 UTC timestamp without pulling in a date crate.
fn chrono_like_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_nanos()
    )
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

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
