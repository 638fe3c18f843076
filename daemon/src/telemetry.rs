//! Tracing set-up shared by the daemons: text or JSON lines on stderr, filtered by
//! `log.level` when the config sets it, else `RUST_LOG`, else `info`. The filter can be
//! swapped while running ([`set_level`]), which is how a reload (SIGHUP) applies a new
//! `log.level`.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The handle of the installed filter; set by the [`init`] that installed the subscriber.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Installs the global subscriber with `level` (a `log.level` value; `None`: `RUST_LOG`,
/// else `info`). Safe to call twice (the second call is a no-op), which tests that start
/// several daemons in one process rely on.
pub fn init(json: bool, level: Option<&str>) {
    let (filter, handle) = reload::Layer::new(filter_for(level));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let installed = if json {
        tracing_subscriber::registry()
            .with(filter)
            .with(lines.json())
            .try_init()
    } else {
        tracing_subscriber::registry()
            .with(filter)
            .with(lines)
            .try_init()
    };
    if installed.is_ok() {
        let _ = FILTER.set(handle);
    }
}

/// Swaps the running filter for `level` (as in [`init`]). Fails when this process's
/// subscriber was not installed by [`init`] (a test harness's own subscriber).
pub fn set_level(level: Option<&str>) -> Result<(), String> {
    let handle = FILTER
        .get()
        .ok_or("the log filter was not installed by the daemon")?;
    handle
        .reload(filter_for(level))
        .map_err(|e| format!("cannot swap the log filter: {e}"))
}

/// Checks a `log.level` value: `RUST_LOG` directives, each either a bare level
/// (`error`, `warn`, `info`, `debug`, `trace`, `off`) or `target=level`. A bare word
/// that is not a level (a typo such as `inf`) would be a target filter that silences
/// almost everything, so it is refused.
pub fn parse_filter(level: &str) -> Result<EnvFilter, String> {
    if level.trim().is_empty() {
        return Err("must not be empty (omit it for RUST_LOG, else info)".into());
    }
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let directives: Vec<&str> = level.split(',').map(str::trim).collect();
    for &directive in &directives {
        let bare_level = LEVELS.iter().any(|l| directive.eq_ignore_ascii_case(l));
        if !bare_level && !directive.contains('=') {
            return Err(format!(
                "`{directive}` is neither a level ({}) nor target=level",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::builder()
        .parse(directives.join(","))
        .map_err(|e| format!("not a valid filter: {e}"))
}

fn filter_for(level: Option<&str>) -> EnvFilter {
    match level.map(parse_filter) {
        Some(Ok(filter)) => filter,
        // Refused when the config was loaded; fall back rather than panic.
        Some(Err(_)) | None => {
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_filter;

    #[test]
    fn levels_and_target_directives_are_filters_and_typos_are_not() {
        for good in ["info", "WARN", "warn,stockd=debug", "tower=off, h2=info"] {
            assert!(parse_filter(good).is_ok(), "{good}");
        }
        for bad in ["", "  ", "inf", "info,stockd", "stockd=loud"] {
            assert!(parse_filter(bad).is_err(), "{bad}");
        }
    }
}
