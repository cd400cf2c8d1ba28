//! Request context carried into a request's events and log lines: the W3C `traceparent` the
//! client put into the ttrpc metadata, and when gantry started serving the request (for the
//! duration of Create, Start, Exec and Delete). Kept in a tokio task-local around the task that
//! serves the request, so emitting code deep in the service needs no extra parameters.

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

/// The metadata key (lower case, as W3C and the containerd clients send it).
pub const TRACEPARENT: &str = "traceparent";

tokio::task_local! {
    static REQUEST: Request;
}

/// What a request carries into its events.
#[derive(Debug, Clone)]
pub struct Request {
    pub started: Instant,
    pub traceparent: Option<String>,
}

impl Request {
    /// From ttrpc request metadata; an invalid `traceparent` is ignored, as W3C asks.
    pub fn from_metadata(metadata: &HashMap<String, Vec<String>>) -> Self {
        let traceparent = metadata
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(TRACEPARENT))
            .and_then(|(_, v)| v.first())
            .and_then(|v| parse_traceparent(v));
        Self {
            started: Instant::now(),
            traceparent,
        }
    }

    /// Runs `fut` with this request as its context.
    pub fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        REQUEST.scope(self, fut)
    }

    /// The request being served by the current task, if any.
    pub fn current() -> Option<Request> {
        REQUEST.try_with(|r| r.clone()).ok()
    }
}

/// Validates a W3C trace context header (`version-traceid-parentid-flags`) and returns it in
/// its canonical lower-case form. Version `ff`, all-zero ids and malformed fields are refused;
/// a future version may carry more fields after the flags, which are dropped.
pub fn parse_traceparent(value: &str) -> Option<String> {
    let v = value.trim();
    let mut parts = v.split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(version, 2) || !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) {
        return None;
    }
    let version = version.to_ascii_lowercase();
    if version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if zero(trace) || zero(parent) {
        return None;
    }
    Some(format!("{version}-{trace}-{parent}-{flags}").to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn valid_traceparents_are_kept() {
        assert_eq!(parse_traceparent(GOOD).as_deref(), Some(GOOD));
        assert_eq!(
            parse_traceparent(&format!(" {} ", GOOD.to_uppercase())).as_deref(),
            Some(GOOD)
        );
        // A later version may append fields; they are dropped.
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra";
        assert_eq!(
            parse_traceparent(v1).as_deref(),
            Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
        );
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn the_request_is_visible_only_inside_its_scope() {
        let md: HashMap<String, Vec<String>> = [("traceparent".to_string(), vec![GOOD.to_string()])].into();
        let r = Request::from_metadata(&md);
        let seen = r.scope(async { Request::current().and_then(|r| r.traceparent) }).await;
        assert_eq!(seen.as_deref(), Some(GOOD));
        assert!(Request::current().is_none());
        assert_eq!(Request::from_metadata(&HashMap::new()).traceparent, None);
    }
}
