//! Fail points for the test suite (the `failpoints` feature; [fail](https://docs.rs/fail),
//! TiKV's). The suite runs the gateway as a child process, so it cannot call
//! `fail::cfg` in it: the points are read from the file named by the environment
//! variable [`ENV`], at start and again on every SIGHUP, one `name=actions` per line
//! in fail's syntax (`gateway::fleet::round=return`; `name=off` turns one off; `#`
//! starts a comment). A point the file no longer names is turned off. Without the
//! variable nothing is configured, and without the feature this module is not built
//! (and `fail_point!` is nothing).
//!
//! Points: `gateway::fleet::round` (a fleet budget round fails before it sends
//! anything, as when this gateway cannot reach Redis while the rest of the fleet can).

use std::collections::HashSet;
use std::sync::Mutex;

/// The environment variable naming the file.
pub const ENV: &str = "SECKILL_FAILPOINTS";

/// The points the last read configured.
static SET: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Reads the file (when [`ENV`] names one) and configures its points; a line fail
/// refuses, or a file that cannot be read, is logged and changes nothing.
pub fn load() {
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(path = ?path, error = %e, "cannot read the fail points file");
            return;
        }
    };
    let mut now = HashSet::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, actions)) = line.split_once('=') else {
            tracing::error!(line, "fail points: not `name=actions`");
            continue;
        };
        let (name, actions) = (name.trim(), actions.trim());
        match fail::cfg(name, actions) {
            Ok(()) => {
                tracing::warn!(name, actions, "fail point configured");
                now.insert(name.to_string());
            }
            Err(e) => tracing::error!(name, actions, error = %e, "fail point refused"),
        }
    }
    let mut set = SET.lock().unwrap_or_else(|e| e.into_inner());
    for gone in set.iter().flatten().filter(|n| !now.contains(*n)) {
        fail::remove(gone);
        tracing::warn!(name = %gone, "fail point removed");
    }
    *set = Some(now);
}
