//! The client half of CRI streaming, as `kubectl exec` reaches a container through kubelet:
//! `Exec` returns a URL on containerd's streaming server, and the client attaches there. This
//! attaches over WebSocket with Kubernetes' remotecommand subprotocol `v4.channel.k8s.io`:
//! every binary message starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 the final
//! status, 4 terminal resize). kubectl itself uses SPDY; containerd's server (kubelet's
//! streaming package) serves both on the same URL, and WebSocket has a maintained client crate,
//! so the tests need no SPDY implementation.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest;
use tungstenite::http::HeaderValue;
use tungstenite::{Error, Message};

const PROTOCOL: &str = "v4.channel.k8s.io";
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
/// The terminal's default EOF key (VEOF, ^D).
const EOF_KEY: u8 = 0x04;

/// What the client sends on stdin.
pub enum Stdin {
    /// No stdin: the exec is asked for without one.
    Nothing,
    /// Stdin is asked for and stays open, silent.
    Open,
    /// These bytes once the streams are open.
    Bytes(Vec<u8>),
    /// The terminal's EOF key again and again until the status arrives: what `crictl exec -it`
    /// sends when its own stdin is at EOF under `script -qec … < /dev/null` (script passes the
    /// EOF on as ^D, crictl's raw terminal forwards it). Writes keep arriving while and after
    /// the process exits, which is the moment that lost tty output before.
    EofKey,
}

/// Everything the server sent before it closed the connection.
#[derive(Default)]
pub struct Streamed {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The status channel's JSON (a Kubernetes `Status`).
    pub status: Vec<u8>,
    /// The server reset the connection under a stdin write that crossed its close, before the
    /// status was read: the status may have been dropped with it (a client-side race; kubectl
    /// and crictl see the same reset), the output before it is whole.
    pub reset: bool,
}

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned();
        f.debug_struct("Streamed")
            .field("stdout", &text(&self.stdout))
            .field("stdout_len", &self.stdout.len())
            .field("stderr", &text(&self.stderr))
            .field("status", &text(&self.status))
            .field("reset", &self.reset)
            .finish()
    }
}

impl Streamed {
    /// The exit code the status reports: 0 for `Success`, else the `ExitCode` cause.
    pub fn exit_code(&self) -> Option<i32> {
        let v: serde_json::Value = serde_json::from_slice(&self.status).ok()?;
        if v["status"] == "Success" {
            return Some(0);
        }
        v["details"]["causes"]
            .as_array()?
            .iter()
            .find(|c| c["reason"] == "ExitCode")?["message"]
            .as_str()?
            .parse()
            .ok()
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Attaches to a streaming URL (`http://host:port/exec/<token>`), feeds `stdin`, and collects
/// the output until the server closes the connection or `limit` passes. Blocking: call it from
/// `spawn_blocking`.
pub fn attach(url: &str, stdin: &Stdin, limit: Duration) -> Result<Streamed, String> {
    let ws_url = url.replacen("http://", "ws://", 1);
    let mut req = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("{url}: {e}"))?;
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(PROTOCOL));
    let authority = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .ok_or(format!("{url}: no host"))?;
    let tcp = TcpStream::connect(&authority).map_err(|e| format!("connect {authority}: {e}"))?;
    let (mut ws, resp) = tungstenite::client(req, tcp).map_err(|e| format!("upgrade {url}: {e}"))?;
    let negotiated = resp.headers().get("Sec-WebSocket-Protocol").cloned();
    if negotiated.as_ref().and_then(|p| p.to_str().ok()) != Some(PROTOCOL) {
        return Err(format!("{url}: the server chose subprotocol {negotiated:?}"));
    }
    // Short reads let one thread both feed stdin and collect output.
    ws.get_ref()
        .set_read_timeout(Some(Duration::from_millis(5)))
        .map_err(|e| e.to_string())?;

    let end = Instant::now() + limit;
    let mut got = Streamed::default();
    let mut pending = match stdin {
        Stdin::Bytes(b) => Some(b.clone()),
        _ => None,
    };
    loop {
        if Instant::now() > end {
            return Err(format!("{url}: no end of stream within {limit:?}; so far {got:?}"));
        }
        match ws.read() {
            Ok(Message::Binary(b)) => match b.split_first() {
                Some((&STDOUT, rest)) => got.stdout.extend_from_slice(rest),
                Some((&STDERR, rest)) => got.stderr.extend_from_slice(rest),
                Some((&STATUS, rest)) => got.status.extend_from_slice(rest),
                _ => {}
            },
            Ok(_) => {}
            Err(Error::ConnectionClosed | Error::AlreadyClosed) => return Ok(got),
            Err(Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                let frame = match (stdin, pending.take()) {
                    (_, Some(bytes)) => Some(bytes),
                    (Stdin::EofKey, None) if got.status.is_empty() => Some(vec![EOF_KEY]),
                    _ => None,
                };
                if let Some(bytes) = frame {
                    let mut msg = vec![STDIN];
                    msg.extend_from_slice(&bytes);
                    // A write racing the server's close is not an error of the exec; when the
                    // server answers it with a reset, the kernel drops what was still unread
                    // (the status frame, sent last): say so rather than fail.
                    match ws.send(Message::Binary(msg.into())) {
                        Ok(()) | Err(Error::ConnectionClosed | Error::AlreadyClosed) => {}
                        Err(Error::Io(e)) if e.kind() == ErrorKind::ConnectionReset && got.status.is_empty() => {
                            got.reset = true;
                            return Ok(got);
                        }
                        Err(_) if !got.status.is_empty() => {}
                        Err(e) => return Err(format!("{url}: stdin: {e}; so far {got:?}")),
                    }
                }
            }
            // Once the status is in, the exec is over: the server may reset the connection
            // instead of closing it (a stdin write crossed its close).
            Err(_) if !got.status.is_empty() => return Ok(got),
            Err(Error::Io(e)) if e.kind() == ErrorKind::ConnectionReset => {
                got.reset = true;
                return Ok(got);
            }
            Err(e) => return Err(format!("{url}: {e}; so far {got:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Streamed;

    #[test]
    fn exit_codes_are_read_from_the_status_the_way_kubectl_reads_them() {
        let ok = Streamed {
            status: br#"{"metadata":{},"status":"Success"}"#.to_vec(),
            ..Default::default()
        };
        assert_eq!(ok.exit_code(), Some(0));
        let failed = Streamed {
            status: br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 4], exit code 4","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"4"}]}}"#.to_vec(),
            ..Default::default()
        };
        assert_eq!(failed.exit_code(), Some(4));
        assert_eq!(Streamed::default().exit_code(), None);
    }
}
