//! The gateway for tests: [`spawn_gateway`] runs the built `gateway` binary (pingora
//! owns its process: signals, threads) as a child process with a generated
//! config on free ports, and waits for `/readyz`. Needs `cargo build -p gateway --bins`.
//!
//! The config has `dev.enabled = true`, so [`GatewayHandle::dev_token`] gets a JWT for
//! any user; [`GatewayHandle::jwt`] signs one locally (also expired ones). It has
//! `h2c = true` (HTTP/1.1 and HTTP/2 prior knowledge on the plain port).
//!
//! Ports: the plain, admin and (when asked for) TLS ports are picked free by the harness
//! (bind, read the port, drop). A tweak asks for a TLS listener with [`tls`], which sets
//! `server.tls_listen` to port 0; the harness puts a free port there (pingora binds what it
//! is given and reports no port back) and returns it as [`GatewayHandle::tls_port`]. When
//! one of the picked ports was taken in between (pingora logs "is in use, will try
//! again"), the gateway is started again on fresh ports, twice at most.
//!
//! Parts: [`http`] (JSON calls through the edge as a browser makes them, on the
//! handle: [`GatewayHandle::get`], [`GatewayHandle::reserve`], ...), [`raw`] (one
//! HTTP/1.1 connection byte by byte), [`proxy`] (a pausable TCP proxy in front of a
//! backend), [`stack`] (the back end an edge test stands in front of).
//!
//! (Over 400 lines: the handle, the generated config and the start-up with its
//! fresh-port retry are one child-process life cycle.)

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{free_port, listens_on, wait_until_async_or, workspace_bin, ChildGuard};
use crate::{RedisCluster, SERVICE_TOKEN};

/// JWT secret of the generated config.
pub const JWT_SECRET: &str = "test-jwt-secret-0123456789";
/// Purchase-token secret of the generated config.
pub const PURCHASE_SECRET: &str = "test-purchase-secret-0123456789";

/// A gateway child process; killed when dropped.
#[derive(Debug)]
pub struct GatewayHandle {
    pub port: u16,
    pub admin_port: u16,
    /// The TLS listener's port, when the tweak asked for one with [`tls`].
    pub tls_port: Option<u16>,
    pub child: ChildGuard,
    /// Config file (`gateway.toml`) and log (`gateway.log`) live here.
    pub dir: tempfile::TempDir,
    config: gateway::toml::Table,
}

impl GatewayHandle {
    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `https://127.0.0.1:<tls port>`; panics when the gateway has no TLS listener.
    pub fn tls_base_url(&self) -> String {
        format!(
            "https://127.0.0.1:{}",
            self.tls_port
                .expect("started without a TLS listener (see `tls`)")
        )
    }

    /// `http://127.0.0.1:<admin port>` (`/metrics`, `/healthz`, `/readyz`).
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    /// One sample of `/metrics`: `labels` as Prometheus prints them (sorted by name,
    /// `a="x",b="y"`), empty for a series without labels; `None` when absent.
    pub async fn metric(&self, name: &str, labels: &str) -> Option<f64> {
        metric_value(&self.metrics().await, name, labels)
    }

    /// The Prometheus text of `/metrics` on the admin port.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin_url()))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("/metrics body")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.toml")
    }

    /// The config it was started with (after the tweak, with the ports the harness picked).
    pub fn config(&self) -> &gateway::toml::Table {
        &self.config
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// A JWT for `user` from `POST /api/v1/dev/token`.
    pub async fn dev_token(&self, user: &str) -> String {
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/dev/token", self.base_url()))
            .json(&serde_json::json!({ "user_id": user }))
            .send()
            .await
            .expect("dev token request");
        assert_eq!(r.status(), 200, "dev token");
        let v: serde_json::Value = r.json().await.expect("dev token json");
        v["token"].as_str().expect("token").to_string()
    }

    /// A JWT signed locally with the config's secret, valid `ttl_secs` from
    /// `now_unix_ms` (pass a time in the past for an expired token).
    pub fn jwt(&self, user: &str, ttl_secs: u64, now_unix_ms: u64) -> String {
        let auth = gateway::config::Auth {
            jwt_secret: JWT_SECRET.into(),
            jwt_leeway_secs: 0,
            purchase_token_secret: PURCHASE_SECRET.into(),
            purchase_token_ttl_secs: 60,
            ..Default::default()
        };
        gateway::auth::Jwt::from_config(&auth)
            .expect("jwt")
            .issue(user, ttl_secs, now_unix_ms)
            .expect("hs256 issues")
            .0
    }

    /// Sets the gateway's fail points to `lines` (`name=actions` per line, fail's
    /// syntax; a point not named is turned off) and sends SIGHUP, which reads them
    /// (`gateway::failpoints`). The config file is read again too, unchanged.
    pub fn fail_points(&self, lines: &str) {
        std::fs::write(self.dir.path().join("failpoints"), lines).expect("write fail points");
        self.hup();
    }

    fn hup(&self) {
        let pid = self.child.id().expect("running");
        let ok = std::process::Command::new("kill")
            .arg("-HUP")
            .arg(pid.to_string())
            .status()
            .expect("kill -HUP");
        assert!(ok.success());
    }

    /// Writes a new config (same ports) and sends SIGHUP.
    pub fn reload(&mut self, tweak: impl FnOnce(&mut gateway::toml::Table)) {
        tweak(&mut self.config);
        std::fs::write(self.config_path(), self.config.to_string()).expect("write config");
        self.hup();
    }

    /// Waits until `GET /api/v1/activities/{a}` answers 200 (the edge has read it
    /// from Redis).
    pub async fn wait_activity(&self, a: u64) {
        let url = format!("{}/api/v1/activities/{a}", self.base_url());
        let http = reqwest::Client::new();
        let last = std::sync::Mutex::new(String::new());
        wait_until_async_or(
            &format!("the gateway to know activity {a}"),
            Duration::from_secs(20),
            || async {
                let answer = match http.get(&url).send().await {
                    Ok(r) if r.status() == 200 => return true,
                    Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
                    Err(e) => e.to_string(),
                };
                *last.lock().unwrap() = answer;
                false
            },
            || {
                let answer = last.lock().unwrap();
                format!(" (last answer: {answer}); log:\n{}", self.log())
            },
        )
        .await;
    }
}

/// The generated config before the tweak.
pub fn base_config(
    redis: &RedisCluster,
    stockd_addr: &str,
    orderd_addr: &str,
    port: u16,
    admin_port: u16,
    dir: &Path,
) -> gateway::toml::Table {
    let nodes = redis
        .nodes()
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let d = dir.display();
    let text = format!(
        r#"
[server]
listen = ["127.0.0.1:{port}"]
threads = 1
h2c = true
pid_file = "{d}/gateway.pid"
upgrade_sock = "{d}/upgrade.sock"
grace_period_secs = 0
graceful_shutdown_timeout_secs = 1
access_log = true

[admin]
listen = "127.0.0.1:{admin_port}"

[redis]
nodes = [{nodes}]
refresh_ms = 500
stock_poll_ms = 100
timeout_ms = 1000

[upstreams]
stockd = "http://{stockd_addr}"
orderd = "http://{orderd_addr}"
service_token = "{SERVICE_TOKEN}"
connect_timeout_ms = 300
reserve_deadline_ms = 1000
order_deadline_ms = 2000

[auth]
jwt_secret = "{JWT_SECRET}"
jwt_leeway_secs = 0
purchase_token_secret = "{PURCHASE_SECRET}"
purchase_token_ttl_secs = 60

[limits]
per_ip = {{ rate = 100000.0, burst = 100000.0 }}
per_user = {{ rate = 100000.0, burst = 100000.0 }}

[bans]
auto_ban_threshold = 0

[protection]
request_read_ms = 5000

[dev]
enabled = true
"#
    );
    text.parse().expect("generated config is TOML")
}

/// What the edge runs against: the Redis Cluster it reads, and the stockd and orderd
/// it forwards to (`host:port`).
#[derive(Debug, Clone, Copy)]
pub struct EdgeDeps<'a> {
    pub redis: &'a RedisCluster,
    pub stockd: &'a str,
    pub orderd: &'a str,
}

/// Starts a gateway for `deps`, with `tweak` applied to the generated config, and waits
/// for `/readyz` (activities read, backends serving).
pub async fn spawn_gateway(
    deps: &EdgeDeps<'_>,
    tweak: impl FnOnce(&mut gateway::toml::Table),
) -> GatewayHandle {
    let mut h = start(deps.redis, deps.stockd, deps.orderd, tweak);
    wait_http(&mut h, "/readyz").await;
    h
}

/// Asks for a TLS listener (rustls, ALPN `h2` and `http/1.1`) with this PEM certificate
/// chain and key, on a port the harness picks ([`GatewayHandle::tls_port`]).
pub fn tls(config: &mut gateway::toml::Table, cert_path: &Path, key_path: &Path) {
    set(config, "server", "tls_listen", "127.0.0.1:0");
    set(
        config,
        "server",
        "tls_cert_path",
        cert_path.display().to_string(),
    );
    set(
        config,
        "server",
        "tls_key_path",
        key_path.display().to_string(),
    );
}

/// [`spawn_gateway`] that waits only for `/healthz` (for tests with a backend down).
pub async fn spawn_gateway_unready(
    deps: &EdgeDeps<'_>,
    tweak: impl FnOnce(&mut gateway::toml::Table),
) -> GatewayHandle {
    let mut h = start(deps.redis, deps.stockd, deps.orderd, tweak);
    wait_http(&mut h, "/healthz").await;
    h
}

fn start(
    redis: &RedisCluster,
    stockd_addr: &str,
    orderd_addr: &str,
    tweak: impl FnOnce(&mut gateway::toml::Table),
) -> GatewayHandle {
    let dir = tempfile::Builder::new()
        .prefix("seckill-gateway-")
        .tempdir()
        .expect("tempdir");
    let (port, admin_port) = (free_port(None), free_port(None));
    let mut config = base_config(
        redis,
        stockd_addr,
        orderd_addr,
        port,
        admin_port,
        dir.path(),
    );
    tweak(&mut config);
    let tls_port = tls_port_wanted(&config).then(|| free_port(None));
    if let Some(p) = tls_port {
        set(
            &mut config,
            "server",
            "tls_listen",
            format!("127.0.0.1:{p}"),
        );
    }
    let child = spawn_child(&config, dir.path());
    GatewayHandle {
        port,
        admin_port,
        tls_port,
        child,
        dir,
        config,
    }
}

/// True when the tweak asked for a TLS listener with [`tls`] (port 0).
fn tls_port_wanted(config: &gateway::toml::Table) -> bool {
    config
        .get("server")
        .and_then(|s| s.get("tls_listen"))
        .and_then(|v| v.as_str())
        .is_some_and(|a| a.ends_with(":0"))
}

/// Writes the config and starts the binary.
fn spawn_child(config: &gateway::toml::Table, dir: &Path) -> ChildGuard {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config.to_string()).expect("write config");
    let mut cmd = std::process::Command::new(workspace_bin("gateway"));
    cmd.arg("-c").arg(&path);
    // Empty: no fail point until a test writes one ([`GatewayHandle::fail_points`]).
    let points = dir.join("failpoints");
    if !points.exists() {
        std::fs::write(&points, "").expect("write the fail points file");
    }
    cmd.env(gateway::failpoints::ENV, &points);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    ChildGuard::spawn("gateway", cmd, &dir.join("gateway.log")).expect("spawn gateway")
}

/// Stops the gateway and starts it again on fresh ports (one was taken after
/// `free_port` picked it). The old log is kept as `gateway.log.<n>`.
fn restart_on_fresh_ports(h: &mut GatewayHandle, attempt: u32) {
    h.child.kill();
    let log = h.dir.path().join("gateway.log");
    let _ = std::fs::rename(&log, h.dir.path().join(format!("gateway.log.{attempt}")));
    h.port = free_port(None);
    h.admin_port = free_port(None);
    h.tls_port = h.tls_port.map(|_| free_port(None));
    if let Some(p) = h.tls_port {
        set(
            &mut h.config,
            "server",
            "tls_listen",
            format!("127.0.0.1:{p}"),
        );
    }
    set(
        &mut h.config,
        "server",
        "listen",
        gateway::toml::Value::Array(vec![format!("127.0.0.1:{}", h.port).into()]),
    );
    set(
        &mut h.config,
        "admin",
        "listen",
        format!("127.0.0.1:{}", h.admin_port),
    );
    h.child = spawn_child(&h.config, h.dir.path());
}

async fn wait_http(h: &mut GatewayHandle, path: &str) {
    for attempt in 1..=3 {
        if wait_http_once(h, path).await {
            return;
        }
        assert!(
            attempt < 3,
            "gateway ports taken on every attempt; log:\n{}",
            h.log()
        );
        eprintln!("gateway: a picked port was taken; starting again on fresh ports");
        restart_on_fresh_ports(h, attempt);
    }
}

/// pingora's log line when a listen address is taken (it retries for 30 s, then panics).
const PORT_IN_USE: &str = "is in use, will try again";

/// Waits for `path` on the admin port: true when it answers 200, false when pingora says
/// one of the picked ports is in use (it would retry binding for 30 s, then panic).
async fn wait_http_once(h: &mut GatewayHandle, path: &str) -> bool {
    let url = format!("{}{path}", h.admin_url());
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if h.log().contains(PORT_IN_USE) {
            return false;
        }
        let ours = |port: u16| h.child.id().is_some_and(|pid| listens_on(pid, port));
        if matches!(http.get(&url).send().await, Ok(r) if r.status() == 200)
            && ours(h.port)
            && h.tls_port.is_none_or(ours)
        {
            // Every listener has been bound (or failed to) by now.
            return !h.log().contains(PORT_IN_USE);
        }
        assert!(h.child.is_running(), "gateway exited; log:\n{}", h.log());
        assert!(
            std::time::Instant::now() < deadline,
            "gateway {path} not OK after 30 s; log:\n{}",
            h.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An `[upstreams] stockd` / `orderd` value in the list form, for a fleet: `http://` and
/// each `host:port`.
pub fn url_list(addrs: &[&str]) -> gateway::toml::Value {
    gateway::toml::Value::Array(addrs.iter().map(|a| format!("http://{a}").into()).collect())
}

/// Sets `section.key = value` in a config table (creating the section).
pub fn set(
    config: &mut gateway::toml::Table,
    section: &str,
    key: &str,
    value: impl Into<gateway::toml::Value>,
) {
    let t = config
        .entry(section.to_string())
        .or_insert_with(|| gateway::toml::Value::Table(Default::default()));
    if let gateway::toml::Value::Table(t) = t {
        t.insert(key.to_string(), value.into());
    }
}

/// Adds `[redis.clusters.<name>] nodes = [...]` naming every node of `redis`: a named
/// cluster activities can be placed on (the default cluster stays the one the harness
/// started the gateway with).
pub fn named_cluster(config: &mut gateway::toml::Table, name: &str, redis: &RedisCluster) {
    let mut cluster = gateway::toml::Table::new();
    cluster.insert(
        "nodes".into(),
        gateway::toml::Value::Array(redis.nodes().into_iter().map(Into::into).collect()),
    );
    let section = config
        .entry("redis".to_string())
        .or_insert_with(|| gateway::toml::Value::Table(Default::default()));
    if let gateway::toml::Value::Table(section) = section {
        let clusters = section
            .entry("clusters".to_string())
            .or_insert_with(|| gateway::toml::Value::Table(Default::default()));
        if let gateway::toml::Value::Table(clusters) = clusters {
            clusters.insert(name.into(), gateway::toml::Value::Table(cluster));
        }
    }
}

/// A `{ rate, burst }` bucket value.
pub fn bucket(rate: f64, burst: f64) -> gateway::toml::Value {
    let mut t = gateway::toml::Table::new();
    t.insert("rate".into(), rate.into());
    t.insert("burst".into(), burst.into());
    gateway::toml::Value::Table(t)
}

pub mod http;
pub mod proxy;
pub mod raw;
pub mod room;
pub mod stack;

pub use http::{call, Answer};
pub use proxy::PausableProxy;
pub use raw::{RawHttp, RawResponse};
pub use stack::Stack;

/// One sample of a Prometheus text page (see [`GatewayHandle::metric`]).
pub fn metric_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}
