//! Reloading a config while the daemon runs (SIGHUP, or `systemctl reload`).
//!
//! The file is read again with the loader of the start-up (file, environment overrides,
//! validation). A config that fails is refused with the error logged, and the daemon
//! keeps running on the config it has. A good one is compared field by field (dotted
//! paths, as in error messages) with the running config: the fields the daemon can
//! change live are applied, and every other changed field is named in a warning: it
//! needs a restart, and the daemon keeps its old value (so a later reload names it
//! again until the restart). Values are never logged, only field names: some are
//! secrets.
//!
//! [`Reloader`] is the shared part; each daemon says which fields are live and applies
//! the ones beyond `log.level` (applied here, [`crate::telemetry::set_level`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::ConfigError;

/// The field every daemon applies live: the log filter.
pub const LOG_LEVEL: &str = "log.level";

/// What one reload did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Changed fields now in effect.
    pub applied: Vec<String>,
    /// Changed fields that need a restart; the old values stay in effect.
    pub needs_restart: Vec<String>,
}

/// A config loader that also returns the merged table ([`crate::config::load_table`]).
type Load<C> = Box<dyn Fn(&Path) -> Result<(C, toml::Table), ConfigError> + Send>;

/// Reads the config again on demand and sorts the changes into live and restart-needed.
pub struct Reloader<C> {
    path: PathBuf,
    load: Load<C>,
    /// Is this dotted field live (applied by [`Reloader::reload`]'s caller or here)?
    live: Box<dyn Fn(&str) -> bool + Send>,
    /// The running config, flattened: the start-up values, with the live fields updated
    /// by each reload.
    running: BTreeMap<String, toml::Value>,
}

impl<C> Reloader<C> {
    /// `running` is the table the daemon started with ([`crate::config::load_table`]);
    /// `load` reads `path` the same way; `live` says which dotted fields can change live.
    pub fn new(
        path: PathBuf,
        running: &toml::Table,
        load: impl Fn(&Path) -> Result<(C, toml::Table), ConfigError> + Send + 'static,
        live: impl Fn(&str) -> bool + Send + 'static,
    ) -> Self {
        Self {
            path,
            load: Box::new(load),
            live: Box::new(live),
            running: flatten(running),
        }
    }

    /// The config file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and validates the file. On success returns the new config (the caller
    /// applies its live fields other than `log.level`) and what changed; `log.level` is
    /// applied here. On error nothing changes.
    pub fn reload(&mut self) -> Result<(C, Reloaded), ConfigError> {
        let (config, table) = (self.load)(&self.path)?;
        let new = flatten(&table);
        let mut done = Reloaded::default();
        for field in changed(&self.running, &new) {
            if !(self.live)(&field) {
                done.needs_restart.push(field);
                continue;
            }
            if field == LOG_LEVEL {
                let level = new.get(LOG_LEVEL).and_then(toml::Value::as_str);
                if let Err(e) = crate::telemetry::set_level(level) {
                    tracing::warn!(field, error = %e, "cannot apply");
                    continue;
                }
            }
            match new.get(&field) {
                Some(v) => self.running.insert(field.clone(), v.clone()),
                None => self.running.remove(&field),
            };
            done.applied.push(field);
        }
        Ok((config, done))
    }

    /// [`Reloader::reload`] with its outcome logged: info naming the applied fields, a
    /// warning per field that needs a restart, an error (and the running config kept)
    /// for a refused file. Returns the new config when the file was good.
    pub fn reload_and_log(&mut self) -> Option<(C, Reloaded)> {
        match self.reload() {
            Ok((config, done)) => {
                for field in &done.needs_restart {
                    tracing::warn!(
                        field = field.as_str(),
                        "reload: `{field}` changed but needs a restart; still running with the old value"
                    );
                }
                tracing::info!(
                    path = %self.path.display(),
                    applied = ?done.applied,
                    needs_restart = ?done.needs_restart,
                    "config reloaded"
                );
                Some((config, done))
            }
            Err(e) => {
                tracing::error!(error = %e, "reload refused; keeping the running config");
                None
            }
        }
    }
}

/// Dotted path → value of every leaf of `table` (arrays are leaves).
pub fn flatten(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, toml::Value>) {
        for (key, value) in table {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                toml::Value::Table(t) => walk(&path, t, out),
                v => {
                    out.insert(path, v.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", table, &mut out);
    out
}

/// Dotted fields whose value differs between `old` and `new`, added and removed ones
/// included, in order.
pub fn changed(
    old: &BTreeMap<String, toml::Value>,
    new: &BTreeMap<String, toml::Value>,
) -> Vec<String> {
    let mut fields: Vec<String> = old
        .keys()
        .chain(new.keys())
        .filter(|k| old.get(*k) != new.get(*k))
        .cloned()
        .collect();
    fields.sort();
    fields.dedup();
    fields
}

/// The SIGHUP stream, installed at once (a SIGHUP before it exists would kill the
/// process), and the loop that reloads on each signal until `shutdown`; `apply` gets
/// each good config with what changed.
#[cfg(unix)]
pub fn on_sighup<C: Send + 'static>(
    mut reloader: Reloader<C>,
    shutdown: crate::shutdown::Shutdown,
    mut apply: impl FnMut(C, &Reloaded) + Send + 'static,
) -> std::io::Result<impl std::future::Future<Output = ()> + Send> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        let stop = shutdown.wait();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    tracing::info!(path = %reloader.path().display(), "SIGHUP: reloading the config");
                    if let Some((config, done)) = reloader.reload_and_log() {
                        apply(config, &done);
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn changes_are_named_by_dotted_path_added_and_removed_included() {
        let old = flatten(&table(
            "[grpc]\nlisten = \"a:1\"\n[stock]\nbatch = 4\n[redis]\nnodes = [\"a:1\"]\n",
        ));
        let new = flatten(&table(
            "[grpc]\nlisten = \"a:1\"\n[redis]\nnodes = [\"a:1\", \"b:2\"]\n[log]\nlevel = \"debug\"\n",
        ));
        assert_eq!(
            changed(&old, &new),
            vec!["log.level", "redis.nodes", "stock.batch"]
        );
        assert!(changed(&old, &old).is_empty());
    }

    fn reloader(path: &Path) -> Reloader<toml::Table> {
        let running = table("[log]\njson = false\n[stock]\nbatch = 4\n");
        Reloader::new(
            path.to_path_buf(),
            &running,
            |p: &Path| {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                let t: toml::Table = text.parse().map_err(|_| ConfigError::Syntax {
                    path: p.display().to_string(),
                    problem: "bad".into(),
                })?;
                Ok((t.clone(), t))
            },
            |field| field == "stock.batch",
        )
    }

    #[test]
    fn live_fields_are_applied_and_the_others_are_named_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.toml");
        let mut r = reloader(&path);
        std::fs::write(&path, "[log]\njson = true\n[stock]\nbatch = 8\n").unwrap();
        let (_, done) = r.reload().unwrap();
        assert_eq!(done.applied, vec!["stock.batch"]);
        assert_eq!(done.needs_restart, vec!["log.json"]);
        // The restart-needed field still differs from what runs: named again.
        let (_, done) = r.reload().unwrap();
        assert!(done.applied.is_empty());
        assert_eq!(done.needs_restart, vec!["log.json"]);
    }

    #[test]
    fn a_bad_file_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.toml");
        let mut r = reloader(&path);
        std::fs::write(&path, "[stock\n").unwrap();
        assert!(r.reload().is_err());
        std::fs::write(&path, "[log]\njson = false\n[stock]\nbatch = 4\n").unwrap();
        assert_eq!(r.reload().unwrap().1, Reloaded::default());
    }
}
