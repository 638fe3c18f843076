//! The start-up every gRPC daemon shares, so `stockd` and `orderd` have the same flags
//! and the same behaviour on a bad config: `-c PATH`, `-t` (validate and exit before
//! touching any socket, Redis or MySQL), `--migrate` (apply the MySQL schema, then
//! serve); a config error is one line on stderr and a non-zero exit; then tracing, the
//! runtime, the gRPC and admin listeners, and the daemon's `run` until SIGINT/SIGTERM.
//! SIGHUP reloads the config ([`crate::reload`]): `log.level` applies live, every other
//! changed field is named in a warning (it needs a restart), a bad file is refused.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser};
use tokio::net::TcpListener;

use serde::de::DeserializeOwned;

use crate::config::Validate;
use crate::reload::{Reloader, LOG_LEVEL};
use crate::shutdown::Shutdown;

#[derive(Debug, Parser)]
struct Flags {
    /// Config file (TOML).
    #[arg(short = 'c', long = "config")]
    config: Option<PathBuf>,
    /// Validate the config (file and environment overrides) and exit: 0 when valid.
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Apply the MySQL migrations (idempotent) before serving.
    #[arg(long)]
    migrate: bool,
}

/// What the shared start-up needs to know of a daemon's config.
#[derive(Debug)]
pub struct Endpoints<'a> {
    /// gRPC listen address.
    pub grpc: &'a str,
    /// Loopback admin (metrics) listen address, if any.
    pub admin: Option<&'a str>,
    /// MySQL URL, for `--migrate`.
    pub mysql_url: &'a str,
    /// JSON log lines instead of text.
    pub json_logs: bool,
    /// `log.level`: the log filter (`None`: `RUST_LOG`, else `info`).
    pub log_level: Option<&'a str>,
    /// Runtime worker threads; 0 = tokio's default (`TOKIO_WORKER_THREADS`, else one
    /// per core); 1 = the current-thread scheduler ([`runtime_builder`]).
    pub worker_threads: usize,
}

/// Runs a daemon: `name` is its binary name (flags' help, default config
/// `deploy/local/<name>.toml`, error prefix), `about` its one-line description,
/// `env_prefix` the prefix of its environment overrides (`STOCKD`).
pub fn main<C, Fut>(
    name: &'static str,
    about: &'static str,
    env_prefix: &'static str,
    endpoints: impl Fn(&C) -> Endpoints<'_>,
    run: impl FnOnce(C, TcpListener, Option<TcpListener>, Shutdown) -> Fut,
) -> ExitCode
where
    C: DeserializeOwned + Validate + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let command = Flags::command()
        .name(name)
        .about(about)
        .version(env!("CARGO_PKG_VERSION"));
    let flags = match Flags::from_arg_matches(&command.get_matches()) {
        Ok(f) => f,
        Err(e) => e.exit(),
    };
    let path = flags
        .config
        .unwrap_or_else(|| crate::config::default_path(name));
    let load = move |p: &Path| crate::config::load_table::<C>(p, env_prefix);
    let (config, table) = match load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if flags.test {
        println!("{}: ok", path.display());
        return ExitCode::SUCCESS;
    }
    // Held until the runtime below is gone (the runtime's tasks may log until then):
    // dropping it writes the lines still queued.
    let log = crate::telemetry::init(
        endpoints(&config).json_logs,
        endpoints(&config).log_level,
        true,
    );
    let threads = endpoints(&config).worker_threads;
    let mut builder = runtime_builder(threads);
    let rt = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(async {
        // SIGHUP's handler first: from here on a reload never kills the process.
        let shutdown = Shutdown::on_signals();
        // Only the log filter changes live; the rest is read once by `run`.
        let reloader = Reloader::new(path, &table, load, |field| field == LOG_LEVEL);
        let reload = crate::reload::on_sighup(reloader, shutdown.clone(), |_: C, _| {})
            .context("install the SIGHUP handler")?;
        tokio::spawn(reload);
        let ends = endpoints(&config);
        if flags.migrate {
            migrate(ends.mysql_url).await?;
        }
        let grpc = TcpListener::bind(ends.grpc)
            .await
            .with_context(|| format!("bind grpc.listen {}", ends.grpc))?;
        let admin = match ends.admin {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("bind admin.listen {addr}"))?,
            ),
            None => None,
        };
        tracing::info!(grpc = ends.grpc, admin = ?ends.admin, "{name} listening");
        run(config, grpc, admin, shutdown).await
    });
    match served {
        Ok(()) => {
            // The last line of a clean stop; `log`'s drop writes it and any still queued.
            tracing::info!("{name} stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e:#}");
            // The runtime's tasks stopped (what they log on the way is queued), then the
            // queued lines written, so the plain line below is the log's last.
            drop(rt);
            drop(log);
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime for `threads` worker threads (0: tokio's default). One thread gets
/// tokio's current-thread scheduler: the same one thread, without the multi-thread
/// scheduler's LIFO slot, which runs a woken task before those already queued. Under
/// load that slot made the HTTP/2 connection task run (and write) after every single
/// answer; with a plain FIFO queue the answers of one Redis reply are all queued first
/// and leave in one write (docs/stockd.md, benchmark).
pub fn runtime_builder(threads: usize) -> tokio::runtime::Builder {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if threads > 0 {
            b.worker_threads(threads);
        }
        b
    };
    builder.enable_all();
    builder
}

async fn migrate(url: &str) -> anyhow::Result<()> {
    let pool = sqlx::MySqlPool::connect(url)
        .await
        .context("mysql (for --migrate)")?;
    crate::migrator().run(&pool).await.context("migrations")?;
    pool.close().await;
    tracing::info!("migrations applied");
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::runtime::RuntimeFlavor;

    use super::runtime_builder;

    #[test]
    fn one_thread_is_the_current_thread_scheduler_and_more_are_multi_thread() {
        let flavor = |n| {
            runtime_builder(n)
                .build()
                .unwrap()
                .handle()
                .runtime_flavor()
        };
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(2), RuntimeFlavor::MultiThread);
        assert_eq!(flavor(0), RuntimeFlavor::MultiThread);
        // Timers and I/O are enabled on both.
        runtime_builder(1).build().unwrap().block_on(async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        });
    }
}
