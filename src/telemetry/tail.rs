//! Follows the event log across rotations. Each retained file (`<log>.N` … `<log>.1`, then
//! `<log>`, oldest first) is read from where the last poll stopped, keyed by inode, so a file
//! renamed by a rotation is neither lost nor read twice, and a line that a writer appended to
//! a file just renamed away is still found. A file is checked by its first bytes too, so a
//! recycled inode starts from the beginning. Only complete lines are consumed; a line being
//! written is read on the next poll. State: one entry per retained file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::log::rotated;

#[derive(Debug, Error)]
pub enum TailError {
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
}

/// Most rotated files looked at (the writer keeps at most 100).
const MAX_ROTATED: u32 = 128;
/// Lines longer than this are skipped (and reported malformed by the caller).
const MAX_LINE: usize = 1 << 20;
const HEAD: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pos {
    offset: u64,
    head: Vec<u8>,
}

/// A reader of the log and its rotated files.
pub struct Tail {
    path: PathBuf,
    files: HashMap<u64, Pos>,
}

impl Tail {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            files: HashMap::new(),
        }
    }

    /// The retained files, oldest first.
    fn candidates(&self) -> Vec<PathBuf> {
        let mut rotated_files: Vec<PathBuf> = (1..=MAX_ROTATED)
            .map(|n| rotated(&self.path, n))
            .take_while(|p| p.exists())
            .collect();
        rotated_files.reverse();
        rotated_files.push(self.path.clone());
        rotated_files
    }

    /// Hands every complete new line (without its newline) to `line`.
    pub fn poll(&mut self, mut line: impl FnMut(&[u8])) -> Result<(), TailError> {
        let mut seen = HashMap::new();
        for path in self.candidates() {
            let mut f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(TailError::Read { path, source }),
            };
            let err = |source| TailError::Read {
                path: path.clone(),
                source,
            };
            let meta = f.metadata().map_err(err)?;
            let head = read_head(&mut f).map_err(err)?;
            let start = match self.files.get(&meta.ino()) {
                Some(p) if head.starts_with(&p.head) && meta.len() >= p.offset => p.offset,
                _ => 0,
            };
            let offset = read_lines(&mut f, start, &mut line).map_err(err)?;
            seen.insert(meta.ino(), Pos { offset, head });
        }
        self.files = seen;
        Ok(())
    }
}

fn read_head(f: &mut File) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(HEAD);
    f.by_ref().take(HEAD as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// Reads complete lines from `start`; returns the offset after the last complete line. An
/// overlong line is handed on as one NUL byte, which the aggregator counts as malformed.
fn read_lines(f: &mut File, start: u64, line: &mut impl FnMut(&[u8])) -> std::io::Result<u64> {
    f.seek(SeekFrom::Start(start))?;
    let mut consumed = start;
    // The current line: its bytes so far (kept unless overlong) and how many were read.
    let mut pending: Vec<u8> = Vec::new();
    let mut line_bytes = 0u64;
    let mut skipping = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(consumed);
        }
        let mut chunk = &buf[..n];
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            if skipping {
                line(b"\0");
            } else {
                pending.extend_from_slice(&chunk[..i]);
                line(&pending);
            }
            consumed += line_bytes + i as u64 + 1;
            line_bytes = 0;
            pending.clear();
            skipping = false;
            chunk = &chunk[i + 1..];
        }
        line_bytes += chunk.len() as u64;
        if skipping {
            continue;
        }
        if pending.len() + chunk.len() > MAX_LINE {
            skipping = true;
            pending = Vec::new();
        } else {
            pending.extend_from_slice(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::log::EventLog;
    use super::*;

    fn collect(t: &mut Tail) -> Vec<String> {
        let mut out = Vec::new();
        t.poll(|l| out.push(String::from_utf8_lossy(l).into_owned())).unwrap();
        out
    }

    #[test]
    fn follows_appends_and_rotations_without_loss_or_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut w = EventLog::new(&path, 200, 5);
        let mut t = Tail::new(&path);
        assert!(collect(&mut t).is_empty());
        let mut got = Vec::new();
        let mut n = 0;
        for round in 0..12 {
            for _ in 0..(round % 4 + 1) {
                w.append(format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "p".repeat(40)).as_bytes())
                    .unwrap();
                n += 1;
            }
            got.extend(collect(&mut t));
        }
        let want: Vec<u64> = (0..n).collect();
        let seen: Vec<u64> = got
            .iter()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seen, want);
        assert!(rotated(&path, 3).exists(), "never rotated");
        assert!(t.files.len() <= 6);
    }

    #[test]
    fn a_partial_line_waits_for_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"b\":").unwrap();
        let mut t = Tail::new(&path);
        assert_eq!(collect(&mut t), ["{\"a\":1}"]);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b"2}\n").unwrap();
        assert_eq!(collect(&mut t), ["{\"b\":2}"]);
        assert!(collect(&mut t).is_empty());
        // A new file under the same name (rotation without us seeing it) is read from 0.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "{\"c\":3}\n").unwrap();
        assert_eq!(collect(&mut t), ["{\"c\":3}"]);
    }
}
