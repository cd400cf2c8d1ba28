//! What the installer did to a host, kept at `/var/lib/gantry/install.json` so that
//! `uninstall` undoes exactly that and no more: the directories it created, the config it
//! wrote (to tell it from a local edit), and how containerd was made to import the drop-in.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{engines::Import, host_path, InstallError};

const STATE_FILE: &str = "/var/lib/gantry/install.json";

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// The file's format; a newer one is refused, not misread.
    pub format: u32,
    /// Host directories this installer created, in creation order.
    #[serde(default)]
    pub created_dirs: Vec<PathBuf>,
    /// sha256 of the config as last written here.
    #[serde(default)]
    pub config_sha: Option<String>,
    #[serde(default)]
    pub import: Option<Import>,
    /// Units whose configuration changed and whose restart has not succeeded yet: the next
    /// run restarts them even though it finds its files in place.
    #[serde(default)]
    pub restart_pending: Vec<String>,
}

const FORMAT: u32 = 1;

pub fn sha(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

impl State {
    pub fn load(host: &Path) -> Result<Self, InstallError> {
        let path = host_path(host, Path::new(STATE_FILE));
        let Ok(text) = std::fs::read(&path) else {
            return Ok(State {
                format: FORMAT,
                ..Default::default()
            });
        };
        let st: State =
            serde_json::from_slice(&text).map_err(|e| InstallError::State(format!("{}: {e}", path.display())))?;
        if st.format > FORMAT {
            return Err(InstallError::State(format!(
                "{} has format {}, newer than the {FORMAT} this installer reads: use the newer installer",
                path.display(),
                st.format
            )));
        }
        Ok(st)
    }

    pub fn save(&mut self, host: &Path) -> Result<(), InstallError> {
        self.format = FORMAT;
        self.create_dirs(host, Path::new(STATE_FILE))?;
        let path = host_path(host, Path::new(STATE_FILE));
        let json = serde_json::to_vec_pretty(self).map_err(|e| InstallError::State(e.to_string()))?;
        crate::files::write_atomic_mode(&path, &json, 0o600).map_err(|e| InstallError::io("write", &path, e))
    }

    /// Creates the missing parents of host path `file`, remembering each one made.
    pub fn create_dirs(&mut self, host: &Path, file: &Path) -> Result<(), InstallError> {
        let mut missing = Vec::new();
        let mut dir = file.parent();
        while let Some(d) = dir.filter(|d| *d != Path::new("/")) {
            if host_path(host, d).exists() {
                break;
            }
            missing.push(d.to_path_buf());
            dir = d.parent();
        }
        for d in missing.into_iter().rev() {
            let path = host_path(host, &d);
            std::fs::create_dir(&path).map_err(|e| InstallError::io("create", &path, e))?;
            if !self.created_dirs.contains(&d) {
                self.created_dirs.push(d);
            }
        }
        Ok(())
    }

    /// This state with the directories `other` created added (the lock's, made before the
    /// state could be read under the lock).
    pub fn merge_dirs(mut self, other: State) -> Self {
        for d in other.created_dirs {
            if !self.created_dirs.contains(&d) {
                self.created_dirs.push(d);
            }
        }
        self
    }

    /// Removes the state file and the directories the installer created, where empty.
    pub fn remove(self, host: &Path) -> Result<(), InstallError> {
        let path = host_path(host, Path::new(STATE_FILE));
        let _ = std::fs::remove_file(&path);
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(host_path(host, d));
        }
        Ok(())
    }
}
