//! `containerd-shim-gantry-v2 metrics`: one Prometheus scrape for the whole node.
//!
//! Counters and histograms come from the event log every daemon appends to ([`super::tail`],
//! [`super::aggregate`]), so they outlive the daemons that counted them; gauges of the live
//! daemons (how many, their resident memory) come from `/proc` at each scrape. Without
//! `--listen` it prints one exposition (for node_exporter's textfile collector); with
//! `--listen ADDR` it serves `GET /metrics` over a minimal HTTP/1.1 responder, polling the log
//! every few seconds so rotations between scrapes lose nothing. Memory stays flat: state is
//! one position per retained log file plus the bounded aggregate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::aggregate::{openmetrics_to_text, AggregateError, Aggregator, DaemonInfo};
use super::event::handler_from_argv0;
use super::tail::{Tail, TailError};
use crate::config::{Config, ConfigError};

#[derive(Debug, Error)]
pub enum ExporterError {
    #[error("metrics: {0}")]
    Usage(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Tail(#[from] TailError),
    #[error(transparent)]
    Aggregate(#[from] AggregateError),
    #[error("metrics --listen {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("metrics: {0}")]
    Io(#[from] std::io::Error),
}

pub const USAGE: &str = "usage: containerd-shim-gantry-v2 metrics [--log PATH] [--config PATH] \
                         [--listen ADDR:PORT] [--pod-labels]";

/// How often `--listen` reads the log between scrapes.
const POLL_EVERY: Duration = Duration::from_secs(5);
/// Bound on reading one HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_REQUEST: usize = 8192;
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the command line asked for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub log: Option<PathBuf>,
    pub config: Option<String>,
    pub listen: Option<String>,
    pub pod_labels: bool,
}

/// Parses the words after `metrics` (`--flag value`, `--flag=value`, one or two dashes).
pub fn parse_args(args: &[String]) -> Result<Options, ExporterError> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let body = arg.trim_start_matches('-');
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| ExporterError::Usage(format!("-{name} needs a value\n{USAGE}")))
        };
        match name {
            "log" => o.log = Some(PathBuf::from(value()?)),
            "config" => o.config = Some(value()?),
            "listen" => o.listen = Some(value()?),
            "pod-labels" => o.pod_labels = true,
            _ => return Err(ExporterError::Usage(format!("unknown argument {arg:?}\n{USAGE}"))),
        }
    }
    Ok(o)
}

/// The node's metrics: the log's aggregate and the live daemons.
pub struct Exporter {
    tail: Tail,
    agg: Aggregator,
}

impl Exporter {
    pub fn new(log: &Path, pod_labels: bool) -> Self {
        Self {
            tail: Tail::new(log),
            agg: Aggregator::new(pod_labels),
        }
    }

    /// Reads what the log gained since the last poll.
    pub fn poll(&mut self) -> Result<(), ExporterError> {
        let agg = &mut self.agg;
        self.tail.poll(|line| agg.observe_line(line))?;
        Ok(())
    }

    /// Polls, refreshes the daemon gauges and encodes one exposition.
    pub fn scrape(&mut self) -> Result<String, ExporterError> {
        self.poll()?;
        self.agg.set_daemons(&live_daemons());
        Ok(self.agg.encode()?)
    }
}

/// Runs the `metrics` action.
pub fn run(args: &[String]) -> Result<(), ExporterError> {
    let o = parse_args(args)?;
    let (config, _) = Config::resolve(o.config.as_deref())?;
    let log = o.log.clone().unwrap_or(config.events.log.clone());
    if log.as_os_str().is_empty() {
        return Err(ExporterError::Usage(
            "the event log is off ([events] log = \"\"); nothing to export".into(),
        ));
    }
    let mut exporter = Exporter::new(&log, o.pod_labels || config.events.pod_labels);
    let Some(addr) = o.listen else {
        // Text format 0.0.4 for the textfile collector; HTTP serves OpenMetrics.
        let text = openmetrics_to_text(&exporter.scrape()?);
        std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
        return Ok(());
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(serve(&addr, exporter))
}

async fn serve(addr: &str, mut exporter: Exporter) -> Result<(), ExporterError> {
    let listen_err = |source| ExporterError::Listen {
        addr: addr.to_string(),
        source,
    };
    let parsed: SocketAddr = addr
        .parse()
        .map_err(|e| listen_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let listener = TcpListener::bind(parsed).await.map_err(listen_err)?;
    eprintln!("gantry metrics: serving http://{}/metrics", listener.local_addr()?);
    let mut tick = tokio::time::interval(POLL_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = exporter.poll() {
                    eprintln!("gantry metrics: {e}");
                }
            }
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // One at a time: a scrape takes milliseconds, a slow client at most the timeout.
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, respond(stream, &mut exporter)).await;
            }
        }
    }
}

/// Reads one request head and answers it; only `GET /metrics` has a body.
async fn respond(mut stream: TcpStream, exporter: &mut Exporter) -> std::io::Result<()> {
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < MAX_REQUEST {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&req);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => match exporter.scrape() {
            Ok(text) => ("200 OK", CONTENT_TYPE, text),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
        },
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".to_string()),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

/// gantry daemons alive now, from `/proc`: processes of this binary (by executable name),
/// other than this one and other short-lived actions.
pub fn live_daemons() -> Vec<DaemonInfo> {
    let me = std::process::id().to_string();
    let Some(name) = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    else {
        return Vec::new();
    };
    let name = name.trim_end_matches(" (deleted)").to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(d) = daemon_at(&entry.path(), &name) {
            out.push(d);
        }
    }
    out
}

fn daemon_at(proc_dir: &Path, name: &str) -> Option<DaemonInfo> {
    let exe = std::fs::read_link(proc_dir.join("exe")).ok()?;
    let exe = exe.to_string_lossy();
    let exe = exe.trim_end_matches(" (deleted)");
    if exe.rsplit('/').next() != Some(name) {
        return None;
    }
    let cmdline = std::fs::read(proc_dir.join("cmdline")).ok()?;
    let words: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    // Daemons show `serve` (or no action word); the rest are short-lived actions.
    let other_action = [
        &b"metrics"[..],
        b"start",
        b"delete",
        b"check-config",
        b"features",
        b"-v",
        b"-info",
    ];
    if words.iter().any(|w| other_action.contains(w)) {
        return None;
    }
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    Some(DaemonInfo {
        handler: handler_from_argv0(exe),
        rss_bytes: rss_kb * 1024,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn arguments() {
        let o = parse_args(&words("--log /x.jsonl -listen=127.0.0.1:9 --pod-labels")).unwrap();
        assert_eq!(o.log, Some(PathBuf::from("/x.jsonl")));
        assert_eq!(o.listen.as_deref(), Some("127.0.0.1:9"));
        assert!(o.pod_labels);
        assert!(parse_args(&words("--listen")).is_err());
        assert!(parse_args(&words("--frob")).is_err());
    }

    #[tokio::test]
    async fn http_serves_metrics_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("events.jsonl");
        std::fs::write(
            &log,
            "{\"v\":1,\"ts\":\"t\",\"event\":\"create\",\"id\":\"a\",\"ns\":\"n\",\"handler\":\"gantry\"}\n",
        )
        .unwrap();
        let mut ex = Exporter::new(&log, false);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let get = move |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let client = tokio::spawn(async move { (get("/metrics").await, get("/").await) });
        for _ in 0..2 {
            let (s, _) = listener.accept().await.unwrap();
            respond(s, &mut ex).await.unwrap();
        }
        let (metrics, other) = client.await.unwrap();
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.contains("gantry_containers_created_total{handler=\"gantry\",namespace=\"n\"} 1"));
        assert!(metrics.trim_end().ends_with("# EOF"));
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    }
}
