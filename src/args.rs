//! Command-line parsing in Go's `flag` syntax, because engines start shims the way the Go
//! runc shim expects: `-id abc`, `-id=abc`, `--id abc`, and a trailing action word.
//!
//! In-tree rather than a crate (checked for the dependency diet):
//! - lexopt 0.3 and clap 4 read `-id` as short options (`-i` and `-d`, or `-i` with value `d`):
//!   a single dash is never a long option there. clap also brings clap_builder, clap_lex and
//!   anstyle at the least.
//! - pico-args 0.5 matches flags by exact text, so `-debug=false` is left over rather than read
//!   as a boolean; with its `=` support an empty `-address=` is an error and quotes in
//!   `-id='x'` are stripped, neither of which Go does.
//! - go-flag 0.1 is a port of Go's `flag`, but a single 2019 release that brings cfg-if 0.1 (a
//!   second cfg-if), and like Go it stops at the first non-flag (`seccomp-profile --caps X`).
//! - getopts 0.2 (rust-lang) in `long_only` mode handles every form, `-debug=false` included
//!   through `optflagopt`, and rejects repeated flags unless declared `multi`; it would replace
//!   some 40 lines here with one more package, which is the wrong way for this diet.

use thiserror::Error;

/// What the engine asked this invocation to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No action word: serve as the daemon on an inherited listener.
    Serve,
    Start,
    Delete,
    Version,
    Info,
    Features,
    CheckConfig(Option<String>),
    /// `seccomp-profile [--caps A,B]`: print gantry's runtime-default seccomp profile.
    SeccompProfile(Option<String>),
    /// `seccomp-profile --recorded NAME`: print a profile recorded on this node.
    RecordedProfile(String),
}

/// Flags shared by every action.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Flags {
    pub namespace: String,
    pub id: String,
    pub address: String,
    pub publish_binary: String,
    pub bundle: String,
    pub socket: String,
    pub debug: bool,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("flag needs an argument: -{0}")]
    MissingValue(String),
    #[error("flag provided but not defined: -{0}")]
    UnknownFlag(String),
    #[error("unknown action {0:?}")]
    UnknownAction(String),
    #[error("invalid boolean value {1:?} for -{0}")]
    BadBool(String, String),
}

/// Parses argv (without the program name).
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<(Flags, Action), ArgsError> {
    let mut flags = Flags::default();
    let mut action = None;
    let mut caps = None;
    let mut recorded = None;
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_ref();
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().map(|s| s.as_ref().to_string()));
            break;
        }
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            positional.push(arg.to_string());
            continue;
        };
        if body.is_empty() {
            positional.push(arg.to_string());
            continue;
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let mut value = |name: &str| -> Result<String, ArgsError> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            let v = args
                .get(i)
                .map(|s| s.as_ref().to_string())
                .ok_or_else(|| ArgsError::MissingValue(name.to_string()))?;
            i += 1;
            Ok(v)
        };
        match name {
            "namespace" => flags.namespace = value(name)?,
            "id" => flags.id = value(name)?,
            "address" => flags.address = value(name)?,
            "publish-binary" => flags.publish_binary = value(name)?,
            "bundle" => flags.bundle = value(name)?,
            "socket" => flags.socket = value(name)?,
            "debug" => flags.debug = parse_bool(name, inline.as_deref())?,
            "v" | "version" => action = Some(Action::Version),
            "info" => action = Some(Action::Info),
            "caps" => caps = Some(value(name)?),
            "recorded" => recorded = Some(value(name)?),
            // Flags newer engines pass that gantry has no use for.
            "systemd-cgroup" | "criu" | "runtime-root" => {
                if inline.is_none() && name != "systemd-cgroup" {
                    value(name)?;
                }
            }
            _ => return Err(ArgsError::UnknownFlag(name.to_string())),
        }
    }
    let action = match action {
        Some(a) => a,
        None => match positional.first().map(String::as_str) {
            None => Action::Serve,
            Some("start") => Action::Start,
            Some("delete") => Action::Delete,
            Some("features") => Action::Features,
            Some("check-config") => Action::CheckConfig(positional.get(1).cloned()),
            Some("seccomp-profile") => match recorded {
                Some(name) => Action::RecordedProfile(name),
                None => Action::SeccompProfile(caps),
            },
            Some(other) => return Err(ArgsError::UnknownAction(other.to_string())),
        },
    };
    Ok((flags, action))
}

fn parse_bool(name: &str, v: Option<&str>) -> Result<bool, ArgsError> {
    match v {
        None | Some("true") | Some("1") | Some("t") | Some("T") | Some("TRUE") => Ok(true),
        Some("false") | Some("0") | Some("f") | Some("F") | Some("FALSE") => Ok(false),
        Some(other) => Err(ArgsError::BadBool(name.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crio_start_argv() {
        let argv = [
            "-namespace",
            "default",
            "-address",
            "",
            "-publish-binary",
            "/usr/bin/crio",
            "-id",
            "abc",
            "-debug",
            "start",
        ];
        let (f, a) = parse(&argv).unwrap();
        assert_eq!(a, Action::Start);
        assert_eq!(f.namespace, "default");
        assert_eq!(f.address, "");
        assert_eq!(f.id, "abc");
        assert!(f.debug);
    }

    #[test]
    fn flag_forms() {
        let (f, a) = parse(&["--namespace=k8s.io", "-id=x", "--bundle", "/b", "delete"]).unwrap();
        assert_eq!(
            (f.namespace.as_str(), f.id.as_str(), f.bundle.as_str()),
            ("k8s.io", "x", "/b")
        );
        assert_eq!(a, Action::Delete);
        assert!(!parse(&["-debug=false"]).unwrap().0.debug);
        let (f, a) = parse(&["--id=a=b", "-address=", "-debug", "start"]).unwrap();
        assert_eq!((f.id.as_str(), f.address.as_str(), f.debug), ("a=b", "", true));
        assert_eq!(a, Action::Start);
    }

    #[test]
    fn probes_and_errors() {
        assert_eq!(parse(&["-v"]).unwrap().1, Action::Version);
        assert_eq!(parse(&["--version"]).unwrap().1, Action::Version);
        assert_eq!(parse(&["-info"]).unwrap().1, Action::Info);
        assert_eq!(parse(&["features"]).unwrap().1, Action::Features);
        assert_eq!(parse::<&str>(&[]).unwrap().1, Action::Serve);
        assert_eq!(
            parse(&["check-config", "/x.toml"]).unwrap().1,
            Action::CheckConfig(Some("/x.toml".into()))
        );
        assert_eq!(parse(&["seccomp-profile"]).unwrap().1, Action::SeccompProfile(None));
        assert_eq!(
            parse(&["seccomp-profile", "--recorded", "web"]).unwrap().1,
            Action::RecordedProfile("web".into())
        );
        assert_eq!(
            parse(&["seccomp-profile", "--caps", "CAP_SYS_ADMIN,CAP_BPF"])
                .unwrap()
                .1,
            Action::SeccompProfile(Some("CAP_SYS_ADMIN,CAP_BPF".into()))
        );
        assert_eq!(parse(&["-id"]), Err(ArgsError::MissingValue("id".into())));
        assert_eq!(parse(&["-bogus", "x"]), Err(ArgsError::UnknownFlag("bogus".into())));
        assert_eq!(parse(&["frob"]), Err(ArgsError::UnknownAction("frob".into())));
    }
}
