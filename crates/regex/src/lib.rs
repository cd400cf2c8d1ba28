//! The two crates in gantry's tree that use `regex` (oci-spec: the `execCPUAffinity` check
//! while a process is deserialised; protobuf-codegen at build time) match ASCII patterns with
//! `Regex::new`, `is_match` and `captures`. Through `regex`, that one reachable `Regex::new`
//! links its Unicode tables: about 136 kB of pointer tables in the daemon's `.data.rel.ro`,
//! which a position-independent binary relocates, so every daemon carries them as private
//! dirty pages. regex-lite (same authors, same syntax, ASCII classes only) has no such tables.
//! `\d` is then `[0-9]`, which is what runc accepts in `execCPUAffinity`.

pub use regex_lite::*;
