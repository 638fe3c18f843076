//! Tracing set-up shared by the daemons: text or JSON lines on stderr, filtered by
//! `log.level` when the config sets it, else `RUST_LOG`, else `info`. The filter can be
//! swapped while running ([`set_level`]), which is how a reload (SIGHUP) applies a new
//! `log.level`.
//!
//! Lines are written by a thread of their own ([`crate::log_writer`]), not by the thread
//! that logs: a runtime thread only formats its line and appends it to a shared buffer.
//! The writer takes everything buffered since its last write and writes it at once,
//! then waits a period ([`crate::log_writer::PERIOD`]) before it looks again, so a burst
//! of access lines costs a few `write`s, not one each, a trickle costs no wake-up per
//! line, and a slow disk or a full pipe never stalls the edge's runtime. Why: the
//! gateway's access line was written to stderr by its one runtime thread, one `write`
//! per request; in the opening burst that was 5 % of the gateway's CPU, and the
//! formatting's colour codes (written into log files too) 2 % more; a writer woken per
//! line then cost 21 µs per request when requests came one at a time (the module doc
//! of `log_writer`). The buffer holds [`QUEUED_LINES`]; past that, lines are dropped
//! rather than making a request wait, and counted (`<daemon>_log_lines_dropped_total`,
//! [`DroppedLines`]). Hold the [`LogGuard`] until the process ends: dropping it writes
//! what is still buffered. A process that forks after [`init`] (the gateway's
//! `--daemon`), or that may end without unwinding before it serves (pingora's bootstrap
//! calls `exit(1)` right after logging why a `-u` takeover failed, and a buffered line
//! would die with the process), starts the writer thread later with [`start_writer`];
//! until then each line is written where it is logged.
//! Colour codes only when stderr is a terminal.

use std::io::{IsTerminal as _, Stderr};
use std::sync::{Mutex, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, Opts};
use tracing_subscriber::fmt::writer::{EitherWriter, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::log_writer::{Queue, Writer, PERIOD};

/// The handle of the installed filter; set by the [`init`] that installed the subscriber.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// The writer thread's buffer, once [`start_writer`] ran; until then lines go straight
/// to stderr.
static WRITER: OnceLock<Queue> = OnceLock::new();

/// The writer thread, stopped by [`LogGuard`]'s drop.
static WRITER_GUARD: Mutex<Option<Writer>> = Mutex::new(None);

/// Lines the writer's buffer holds before new ones are dropped (about 30 MB of access
/// lines; at 100,000 lines a second, a second and more of a stalled disk).
pub const QUEUED_LINES: usize = 128_000;

/// Where the subscriber's lines go: the writer thread's queue once started, else stderr.
#[derive(Clone, Copy)]
struct Lines;

impl<'a> MakeWriter<'a> for Lines {
    type Writer = EitherWriter<&'static Queue, Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        match WRITER.get() {
            Some(queue) => EitherWriter::A(queue),
            None => EitherWriter::B(std::io::stderr()),
        }
    }
}

/// Stops the log writer when dropped: the lines still buffered are written (the writer
/// is given about a second), then its thread ends. Hold it until the process exits.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    installed: bool,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if self.installed {
            let guard = WRITER_GUARD
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            drop(guard);
        }
    }
}

/// Installs the global subscriber with `level` (a `log.level` value; `None`: `RUST_LOG`,
/// else `info`). Safe to call twice (the second call is a no-op, and its guard stops
/// nothing), which tests that start several daemons in one process rely on.
/// `background`: start the writer thread now ([`start_writer`]). A process about to
/// fork, or to run code that may `exit` on its own, passes `false` and calls
/// [`start_writer`] after (the gateway, once pingora's bootstrap and `--daemon`'s fork
/// are behind it: a thread started before the fork does not exist after it); until then
/// each line is written by the thread that logs it.
pub fn init(json: bool, level: Option<&str>, background: bool) -> LogGuard {
    let (filter, handle) = reload::Layer::new(filter_for(level));
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(Lines);
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
    if installed.is_err() {
        return LogGuard { installed: false };
    }
    let _ = FILTER.set(handle);
    if background {
        start_writer();
    }
    LogGuard { installed: true }
}

/// Starts the writer thread (see the module), once; later calls do nothing. Lines
/// logged from now on are queued for it.
pub fn start_writer() {
    let mut slot = WRITER_GUARD.lock().unwrap_or_else(|p| p.into_inner());
    if WRITER.get().is_some() {
        return;
    }
    let Ok((queue, writer)) = Writer::start("log-writer", std::io::stderr(), QUEUED_LINES, PERIOD)
    else {
        // No thread to be had: lines stay written where they are logged.
        return;
    };
    if WRITER.set(queue).is_ok() {
        *slot = Some(writer);
    }
}

/// `<prefix>_log_lines_dropped_total`: the log lines this process dropped because the
/// writer's queue was full (0 while no writer thread runs). Read at each scrape from
/// the writer's own count.
#[derive(Clone)]
pub struct DroppedLines {
    opts: Opts,
    template: IntCounter,
}

impl DroppedLines {
    /// The collector for a daemon whose metrics are named `<prefix>_...`.
    pub fn new(prefix: &str) -> Self {
        let opts = Opts::new(
            format!("{prefix}_log_lines_dropped_total"),
            "Log lines dropped because the log writer's queue was full (a stalled stderr)",
        );
        let template = IntCounter::with_opts(opts.clone()).expect("a valid metric name");
        Self { opts, template }
    }

    fn family(&self, dropped: u64) -> Vec<MetricFamily> {
        // A fresh counter per scrape: two scrapes at once each report the writer's count.
        let counter = IntCounter::with_opts(self.opts.clone()).expect("a valid metric name");
        counter.inc_by(dropped);
        counter.collect()
    }
}

impl Collector for DroppedLines {
    fn desc(&self) -> Vec<&Desc> {
        self.template.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.family(WRITER.get().map_or(0, Queue::dropped_lines))
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
    use super::{parse_filter, DroppedLines};
    use prometheus::{Encoder as _, Registry, TextEncoder};

    fn text(r: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn dropped_lines_are_a_counter_named_for_the_daemon_read_at_each_scrape() {
        let dropped = DroppedLines::new("stockd");
        let r = Registry::new();
        r.register(Box::new(dropped.clone())).unwrap();
        // No subscriber installed by `init` in this test: nothing dropped.
        let scraped = text(&r);
        assert!(
            scraped.contains("# TYPE stockd_log_lines_dropped_total counter"),
            "{scraped}"
        );
        assert!(
            scraped.contains("\nstockd_log_lines_dropped_total 0\n"),
            "{scraped}"
        );
        let family = dropped.family(7);
        let mut out = Vec::new();
        TextEncoder::new().encode(&family, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("\nstockd_log_lines_dropped_total 7\n"),
            "{out}"
        );
    }

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
