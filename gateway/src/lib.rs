//! The seckill edge gateway, built on pingora: answers the crowd that cannot buy at
//! the cost of a static response, and passes the rest to stockd and orderd over gRPC.
//!
//! Layout (the request pipeline, in order, then the plumbing):
//! - [`routes`]: method + path → [`routes::Route`].
//! - [`filters`]: the pipeline: [`filters::Filter`], the context, and the ordered
//!   lists (edge, authenticated, after body), one file per filter.
//! - [`handlers`]: the route handlers (activities, reserve, orders, payments, events,
//!   dev).
//! - [`proxy`]: pingora's `ProxyHttp`: sequences the filters and the handler.
//! - state the filters read, importing nothing of the pipeline: [`shared`] (the hub),
//!   [`ip_ban`], [`rate_limit`], [`sold_out`] (the catalog), [`auth`] (JWT),
//!   [`purchase_token`], [`admission`] (the in-flight cap).
//! - [`forward`]: gRPC clients and the mapping of gRPC answers to HTTP; [`batch`]: the
//!   reservations to one stockd endpoint, batched into `ReserveBatch` calls.
//! - [`upstream`]: the stockd and orderd fleets: health loops, endpoint choice,
//!   failover.
//! - [`answer`]: the refusals with their stable codes, canned where hot.
//! - [`deadline`]: the total read deadline per request (slow clients).
//! - [`fast_lane`]: the hot refusals of plain HTTP/1.1 written before pingora's session.
//! - [`redis`]: background feeds (activities, stock, sold-out, bans).
//! - [`fair`]: fair entry: [`fair::room`], the virtual waiting room (its own Redis
//!   tick loop; the purchase-token handler asks it first), and [`fair::challenge`], the
//!   proof-of-work challenge before a purchase token.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, the room knobs. [`metrics`]: the registry.
//! - [`config`]: the TOML file. [`run`]: builds the pingora server and runs it.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod answer;
pub mod auth;
pub mod batch;
pub mod config;
pub mod deadline;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod fair;
pub mod fast_lane;
pub mod filters;
pub mod fleet;
pub mod forward;
pub mod handlers;
pub mod ip_ban;
pub mod metrics;
pub mod proxy;
pub mod purchase_token;
pub mod rate_limit;
pub mod redis;
pub mod routes;
pub mod shared;
pub mod sold_out;
pub mod upstream;

/// The TOML crate the config is written in, for tools and tests that generate configs.
pub use toml;

use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Seconds an HTTP/2 connection may stay open with no request in flight (pingora keeps
/// idle HTTP/1.1 connections 60 s).
pub const H2_IDLE_SECS: u64 = 60;

/// How the process was started.
#[derive(Debug, Clone, Default)]
pub struct RunOpts {
    /// The config file, read again on SIGHUP.
    pub config_path: PathBuf,
    /// The config as TOML (the file with the environment overrides applied,
    /// [`seckill_daemon::config::load_table`]): what a SIGHUP compares field by field.
    pub config_table: toml::Table,
    /// Take the listeners over from a running gateway (graceful upgrade, `-u`).
    pub upgrade: bool,
    /// Detach into the background (`-d`).
    pub daemon: bool,
}

/// Builds the pingora server (HTTP service, admin service, Redis feeds, SIGHUP reload)
/// and runs it until SIGTERM/SIGINT, or SIGQUIT for a graceful upgrade; returns once
/// the services have stopped (with `--daemon`, only in the forked child).
pub fn run(config: config::Config, opts: RunOpts) -> anyhow::Result<()> {
    let mut conf = ServerConf::new().ok_or_else(|| anyhow::anyhow!("pingora default conf"))?;
    conf.threads = config.server.threads;
    conf.work_stealing = config.server.work_stealing;
    conf.pid_file = config.server.pid_file.clone();
    conf.upgrade_sock = config.server.upgrade_sock.clone();
    conf.grace_period_seconds = Some(config.server.grace_period_secs);
    conf.graceful_shutdown_timeout_seconds = Some(config.server.graceful_shutdown_timeout_secs);
    conf.daemon = opts.daemon;
    let opt = Opt {
        upgrade: opts.upgrade,
        daemon: opts.daemon,
        nocapture: false,
        test: false,
        conf: None,
    };
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    #[cfg(feature = "failpoints")]
    failpoints::load();

    let (announce_tx, announce_rx) = tokio::sync::mpsc::channel(1024);
    let shared = Arc::new(shared::Shared::new(
        config.clone(),
        metrics::Metrics::new(),
        announce_tx,
    )?);
    let read_ms = Arc::new(AtomicU64::new(config.protection.request_read_ms));

    let mut http =
        pingora::proxy::http_proxy(&server.configuration, proxy::Gateway::new(shared.clone()));
    let mut options = HttpServerOptions::default();
    options.h2c = config.server.h2c;
    // An HTTP/2 connection (h2c, or ALPN h2 over TLS) with no request in flight is closed
    // after this long, like pingora's HTTP/1.1 keep-alive; `deadline.rs` explains why the
    // read deadline does not cover idle HTTP/2 connections.
    options.h2_idle_timeout = Some(std::time::Duration::from_secs(H2_IDLE_SECS));
    http.server_options = Some(options);
    let mut svc = Service::new(
        "seckill gateway".to_string(),
        deadline::Guarded::new(
            http,
            read_ms.clone(),
            config.server.h2c,
            config.server.fast_lane.then(|| shared.clone()),
        ),
    );
    svc.set_connection_filter(Arc::new(filters::ConnectionBan(shared.clone())));
    for addr in &config.server.listen {
        // No L4 read buffer on the plain listeners. pingora's default puts a 64 KiB
        // buffer in front of every accepted socket, allocated zeroed at the handshake:
        // at a sale's opening every new connection of the herd then zeroes (and, in a
        // process that has not yet grown its heap that far, page-faults in) 64 KiB
        // before its first byte is read, which was most of the gateway's page faults
        // in the herd (docs/load-testing.md, "The herd's new connections"). Plain
        // HTTP/1.1 is read by the fast lane and pingora's session into their own
        // buffers anyway (4 KiB to start, like nginx's 1 KiB header buffer), and h2c
        // by the h2 codec into its own. The TLS listener keeps pingora's default:
        // rustls reads in small chunks, which the buffer saves system calls for.
        svc.add_listener(
            ListenerConfig::tcp(addr.as_str()).l4_buffer(L4BufferSettings::default().read(0)),
        );
    }
    if !config.server.tls_listen.is_empty() {
        // rustls (pingora's `rustls` feature, ring provider). The files were checked when
        // the config was loaded: pingora panics on a bad one when the listener starts.
        let mut tls =
            TlsSettings::intermediate(&config.server.tls_cert_path, &config.server.tls_key_path)
                .map_err(|e| anyhow::anyhow!("server.tls_listen: {e}"))?;
        // ALPN: h2 preferred, http/1.1 for the rest (h2c is for plain listeners only).
        tls.enable_h2();
        svc.add_tls_with_settings(&config.server.tls_listen, None, tls);
    }
    server.add_service(svc);

    let mut admin = Service::new(
        "gateway admin".to_string(),
        admin::Admin::new(shared.clone()),
    );
    admin.add_tcp(&config.admin.listen);
    server.add_service(admin);

    // The log writer thread starts here, once the services run: in a `--daemon`
    // gateway's forked child (a thread started before the fork would not exist in it),
    // and after `server.bootstrap()` above, which ends the process with `exit(1)` when a
    // `-u` takeover fails (a line queued by then would be lost). Lines logged before it
    // starts (a few milliseconds of start-up) are written one by one, none lost.
    server.add_service(background_service("log writer", LogWriter));
    server.add_service(background_service(
        "redis feeds",
        redis::Feeds::new(shared.clone(), announce_rx),
    ));
    server.add_service(background_service(
        "fleet budgets",
        fleet::FleetSync::new(shared.clone()),
    ));
    server.add_service(background_service(
        "waiting room",
        fair::room::tick::Ticker::new(shared.clone()),
    ));
    server.add_service(background_service(
        "upstream health",
        upstream::Health::new(shared.clone()),
    ));
    server.add_service(background_service(
        "sighup reload",
        Reload {
            shared,
            path: opts.config_path,
            table: opts.config_table,
            read_ms,
        },
    ));
    tracing::info!(
        listen = ?config.server.listen,
        h2c = config.server.h2c,
        tls_listen = %config.server.tls_listen,
        admin = %config.admin.listen,
        "gateway starting"
    );
    // `run`, not `run_forever`: that one exits the process itself, before `main` could
    // write the log lines still queued.
    server.run(pingora::server::RunArgs::default());
    Ok(())
}

/// Whether a changed field (dotted path) takes effect on SIGHUP. The rest (listeners,
/// threads, Redis, upstreams, the JWT algorithm and secret of the single-key spelling,
/// dev, the admin port, JSON logs) is read once at start: a SIGHUP names each such change
/// in a warning, and a graceful upgrade (`systemctl reload gateway`: `-u` + SIGQUIT)
/// applies it without dropping a connection.
pub fn reloads_live(field: &str) -> bool {
    const SECTIONS: [&str; 6] = [
        "limits.",
        "bans.",
        "admission.",
        "protection.",
        "auth.keys",
        "challenge.",
    ];
    const FIELDS: [&str; 4] = [
        "server.access_log",
        "auth.jwks_path",
        "auth.issuer",
        "auth.audience",
    ];
    SECTIONS.iter().any(|s| field.starts_with(s))
        || FIELDS.contains(&field)
        || field == seckill_daemon::reload::LOG_LEVEL
}

/// Starts the log writer thread (`seckill_daemon::telemetry::start_writer`) once pingora
/// runs its services, i.e. after the bootstrap and `--daemon`'s fork (a second start
/// is a no-op).
struct LogWriter;

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for LogWriter {
    async fn start(&self, _shutdown: pingora::server::ShutdownWatch) {
        seckill_daemon::telemetry::start_writer();
    }
}

/// SIGHUP: read the file again (with the environment overrides, validated as at start);
/// on success apply the live fields ([`reloads_live`], [`shared::Shared::apply_reload`],
/// and the JWT key set: `auth.keys`, `auth.jwks_path` re-read, issuer, audience) and name
/// every other changed field in a warning; a bad file is refused and logged.
/// Connections and in-flight requests are untouched.
struct Reload {
    shared: Arc<shared::Shared>,
    path: PathBuf,
    table: toml::Table,
    read_ms: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for Reload {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::error!("cannot install the SIGHUP handler");
            return;
        };
        let mut reloader = seckill_daemon::reload::Reloader::new(
            self.path.clone(),
            &self.table,
            |p: &std::path::Path| {
                seckill_daemon::config::load_table::<config::Config>(p, config::ENV_PREFIX)
            },
            reloads_live,
        );
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // SIGTERM, or the end of a graceful upgrade's hand-over.
                    tracing::info!(
                        grace_period_secs = self.shared.cfg.server.grace_period_secs,
                        "shutting down: the listeners stop accepting; accepted requests have the grace period"
                    );
                    return;
                }
                _ = hup.recv() => {
                    #[cfg(feature = "failpoints")]
                    failpoints::load();
                    if let Some((c, _)) = reloader.reload_and_log() {
                        self.read_ms.store(c.protection.request_read_ms, Ordering::Relaxed);
                        self.shared.apply_reload(&c);
                        match auth::Jwt::from_config(&c.auth) {
                            Ok(jwt) => {
                                let keys = jwt.key_count();
                                self.shared.set_jwt(jwt);
                                tracing::info!(keys, "reloaded the JWT key set");
                            }
                            Err(e) => tracing::error!(error = %e, "JWT keys not reloaded; keeping the running set"),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reloads_live;

    #[test]
    fn the_policy_sections_reload_live_and_listeners_and_secrets_do_not() {
        for live in [
            "limits.max_tracked",
            "limits.per_ip.rate",
            "bans.deny",
            "admission.k",
            "protection.request_read_ms",
            "challenge.keys",
            "server.access_log",
            "log.level",
        ] {
            assert!(reloads_live(live), "{live}");
        }
        for restart in [
            "server.listen",
            "server.threads",
            "redis.nodes",
            "upstreams.stockd",
            "auth.jwt_secret",
            "admin.listen",
            "log.json",
        ] {
            assert!(!reloads_live(restart), "{restart}");
        }
    }
}
