//! Real Redis servers for tests: a Redis Cluster of N masters (slots split evenly, no
//! replicas) and a standalone server. Each node is a `redis-server` child process on a
//! free port with its files in a temporary directory; all of it goes when the handle
//! drops.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process::{free_port, port_open, run_ok, wait_until, ChildGuard};

/// Persistence of the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing on disk: a restart comes back empty (the state-loss case).
    None,
    /// AOF with `appendfsync everysec`, as the local stack runs it.
    AofEverySec,
}

#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<ChildGuard>,
}

/// A Redis Cluster of `masters` nodes on 127.0.0.1.
#[derive(Debug)]
pub struct RedisCluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    persistence: Persistence,
}

impl RedisCluster {
    /// Three masters, no persistence.
    pub fn start() -> Self {
        Self::start_with(3, Persistence::None)
    }

    /// `masters` masters (1..=16), each owning an even share of the 16384 slots.
    ///
    /// A start that fails (a port taken between choosing it and binding it, by a test
    /// running in parallel) is torn down and tried again on fresh ports, 3 times at most.
    pub fn start_with(masters: usize, persistence: Persistence) -> Self {
        crate::process::with_retries("Redis Cluster", || Self::try_start(masters, persistence))
    }

    fn try_start(masters: usize, persistence: Persistence) -> Self {
        assert!((1..=16).contains(&masters));
        let dir = tempfile::Builder::new()
            .prefix("seckill-redis-cluster-")
            .tempdir()
            .expect("tempdir");
        let mut cluster = Self {
            dir,
            nodes: Vec::new(),
            persistence,
        };
        for _ in 0..masters {
            let port = free_port(Some(10_000));
            cluster.nodes.push(Node { port, child: None });
        }
        for i in 0..masters {
            cluster.start_node(i);
        }
        let per = 16384 / masters;
        for (i, node) in cluster.nodes.iter().enumerate() {
            let first = i * per;
            let last = if i + 1 == masters {
                16383
            } else {
                first + per - 1
            };
            cli(
                node.port,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            );
        }
        let first = cluster.nodes[0].port;
        for node in &cluster.nodes[1..] {
            cli(
                first,
                &["CLUSTER", "MEET", "127.0.0.1", &node.port.to_string()],
            );
        }
        cluster.wait_ok();
        cluster
    }

    /// `host:port` of every node, for configs.
    pub fn nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// A `redis-cluster://` URL naming every node (fred's format).
    pub fn url(&self) -> String {
        let mut url = format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port);
        for (k, n) in self.nodes.iter().enumerate().skip(1) {
            url.push(if k == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", n.port));
        }
        url
    }

    /// A connected fred client for the cluster.
    pub async fn client(&self) -> fred::clients::Client {
        connect(&self.url()).await
    }

    /// Runs a command on node `i` with `redis-cli` and returns its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        cli(self.nodes[i].port, args)
    }

    /// FLUSHALL on every master: Redis loses every key, as after a restart without data.
    pub fn flush_all(&self) {
        for n in &self.nodes {
            cli(n.port, &["FLUSHALL"]);
        }
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            c.kill();
        }
    }

    /// Starts node `i` again on its port, with its cluster config (and its AOF when
    /// persistence is on), and waits until the cluster is healthy.
    pub fn restart_node(&mut self, i: usize) {
        self.kill_node(i);
        self.start_node(i);
        self.wait_ok();
    }

    fn start_node(&mut self, i: usize) {
        let port = self.nodes[i].port;
        let dir = self.dir.path().join(format!("node-{port}"));
        std::fs::create_dir_all(&dir).expect("node dir");
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "2000", "--save", ""])
            .arg("--dir")
            .arg(&dir);
        match self.persistence {
            Persistence::None => cmd.args(["--appendonly", "no"]),
            Persistence::AofEverySec => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"])
            }
        };
        let child = ChildGuard::spawn(&format!("redis-{port}"), cmd, &dir.join("redis.log"))
            .expect("spawn redis-server");
        self.nodes[i].child = Some(child);
        wait_until(
            &format!("redis-server on {port}"),
            Duration::from_secs(10),
            || port_open(port) && try_cli(port, &["PING"]).is_some_and(|o| o.contains("PONG")),
        );
    }

    fn wait_ok(&self) {
        let n = self.nodes.len();
        wait_until(
            "cluster_state:ok on every node",
            Duration::from_secs(20),
            || {
                self.nodes.iter().all(|node| {
                    try_cli(node.port, &["CLUSTER", "INFO"]).is_some_and(|info| {
                        info.contains("cluster_state:ok")
                            && info.contains(&format!("cluster_known_nodes:{n}"))
                    })
                })
            },
        );
    }

    /// Directory holding the nodes' files (logs, AOF), for debugging a failed test.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// A standalone `redis-server` on a free port.
#[derive(Debug)]
pub struct RedisServer {
    _dir: tempfile::TempDir,
    port: u16,
    _child: ChildGuard,
}

impl RedisServer {
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("seckill-redis-")
            .tempdir()
            .expect("tempdir");
        let port = free_port(None);
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path());
        let child = ChildGuard::spawn("redis", cmd, &dir.path().join("redis.log"))
            .expect("spawn redis-server");
        wait_until(
            &format!("redis-server on {port}"),
            Duration::from_secs(10),
            || try_cli(port, &["PING"]).is_some_and(|o| o.contains("PONG")),
        );
        Self {
            _dir: dir,
            port,
            _child: child,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn client(&self) -> fred::clients::Client {
        connect(&self.url()).await
    }
}

/// A fred client connected to `url` (a `redis-cluster://` URL from [`RedisCluster::url`]).
pub async fn connect(url: &str) -> fred::clients::Client {
    use fred::prelude::*;
    let config = Config::from_url(url).expect("redis url");
    let client = Builder::from_config(config).build().expect("redis client");
    client.init().await.expect("connect to redis");
    client
}

fn cli(port: u16, args: &[&str]) -> String {
    run_ok(
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args),
    )
}

fn try_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `s` as a user id for a script call a test builds (panics on an id the rule refuses).
pub fn user_id(s: &str) -> seckill_lua::UserId {
    seckill_lua::UserId::parse(s).unwrap_or_else(|e| panic!("user id {s:?}: {e}"))
}

/// `s` as a request id for a script call a test builds.
pub fn request_id(s: &str) -> seckill_lua::RequestId {
    seckill_lua::RequestId::parse(s).unwrap_or_else(|e| panic!("request id {s:?}: {e}"))
}

/// One typed script call (`seckill_lua::calls`) as the daemons send it: by SHA, with
/// the scripts loaded again on `NOSCRIPT` (`seckill_daemon::redis::Scripts`).
pub async fn call<C: seckill_lua::calls::Call>(
    redis: &fred::clients::Client,
    call: C,
) -> fred::types::Value {
    let (keys, args) = call.into_parts();
    seckill_daemon::redis::Scripts::new()
        .eval(redis, &C::SCRIPT, keys, args)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", C::SCRIPT.name))
        .value
}
