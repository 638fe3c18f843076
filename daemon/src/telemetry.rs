//! Tracing set-up shared by the daemons: `RUST_LOG` filter (default `info`), text or
//! JSON lines on stderr.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call twice (the second call is a no-op),
/// which tests that start several daemons in one process rely on.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
