//! Real Redis servers for tests: a Redis Cluster (N masters with the slots split evenly,
//! optionally R replicas per master) and a standalone server. Each node is a
//! `redis-server` child process on a free port with its files in a temporary directory;
//! all of it goes when the handle drops.
//!
//! Parts:
//! - [`RedisCluster::start`] / [`RedisCluster::start_with`]: masters only.
//! - [`RedisCluster::start_replicated`] / [`RedisCluster::start_spec`] with a
//!   [`ClusterSpec`]: masters with replicas, tuned to fail over within a few seconds.
//! - Topology questions, answered from the live cluster (roles change on failover):
//!   [`RedisCluster::master_of_key`], [`RedisCluster::master_of_slot`],
//!   [`RedisCluster::master_of`], [`RedisCluster::replicas_of`], [`RedisCluster::masters`].
//! - Faults by port: [`RedisCluster::kill`], [`RedisCluster::restart`],
//!   [`RedisCluster::stall`], and [`RedisCluster::wait_for_failover`].
//!
//! Every harness call to a node goes through `redis-cli` under a time limit, so a node
//! that is stalled or gone makes a call fail (or a wait time out), never hang the test.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::process::{free_port, port_open, wait_until, ChildGuard};

/// Persistence of the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing on disk: a restart comes back empty (the state-loss case).
    None,
    /// AOF with `appendfsync everysec`, as the local stack runs it.
    AofEverySec,
}

/// `min-replicas-to-write` and `min-replicas-max-lag`: a master refuses writes
/// (`NOREPLICAS`) while fewer than `to_write` replicas acknowledged within `max_lag_secs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinReplicas {
    /// Replicas that must be connected and recent for a master to take writes.
    pub to_write: u32,
    /// Largest replica lag (seconds since its last acknowledgement) that still counts.
    pub max_lag_secs: u32,
}

/// What [`RedisCluster::start_spec`] starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Masters (1..=16), each owning an even share of the 16384 slots. A failover needs
    /// a majority of masters to agree that one failed: use at least 3 to test failover.
    pub masters: usize,
    /// Replicas following each master (0..=4). Default 0.
    pub replicas_per_master: usize,
    /// AOF or nothing on disk, on every node. Default [`Persistence::None`].
    pub persistence: Persistence,
    /// `cluster-node-timeout`, ms: how long a node may not answer before it is suspected
    /// failing; a replica takes over about this long plus 0.5-1.5 s after its master
    /// dies. Default 2000 for masters only, 1000 with replicas (see
    /// [`ClusterSpec::replicated`]).
    pub node_timeout_ms: u64,
    /// `min-replicas-to-write` / `min-replicas-max-lag`, set on every node (a replica may
    /// become a master). Default `None`: off, as in Redis.
    pub min_replicas: Option<MinReplicas>,
}

impl ClusterSpec {
    /// `masters` masters, no replicas, no persistence, node timeout 2000 ms.
    pub fn masters(masters: usize) -> Self {
        Self {
            masters,
            replicas_per_master: 0,
            persistence: Persistence::None,
            node_timeout_ms: 2000,
            min_replicas: None,
        }
    }

    /// `masters` masters with `replicas_per_master` replicas each, node timeout 1000 ms.
    pub fn replicated(
        masters: usize,
        replicas_per_master: usize,
        persistence: Persistence,
    ) -> Self {
        Self {
            replicas_per_master,
            persistence,
            node_timeout_ms: 1000,
            ..Self::masters(masters)
        }
    }

    /// The same spec with `min-replicas-to-write to_write` and `min-replicas-max-lag
    /// max_lag_secs` on every node.
    pub fn min_replicas(mut self, to_write: u32, max_lag_secs: u32) -> Self {
        self.min_replicas = Some(MinReplicas {
            to_write,
            max_lag_secs,
        });
        self
    }

    /// The same spec with `cluster-node-timeout` set to `ms`.
    pub fn node_timeout_ms(mut self, ms: u64) -> Self {
        self.node_timeout_ms = ms;
        self
    }
}

#[derive(Debug)]
struct Node {
    port: u16,
    child: Option<ChildGuard>,
}

/// A Redis Cluster on 127.0.0.1: masters, and replicas when the spec asks for them.
///
/// Nodes are named by port. Roles are not fixed: after a failover a former replica is
/// a master, and a former master restarted with [`RedisCluster::restart`] comes back as
/// a replica; every topology question asks the live cluster.
#[derive(Debug)]
pub struct RedisCluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    spec: ClusterSpec,
    /// Ports stopped by [`RedisCluster::stall`] right now: not asked anything.
    stalled: Arc<Mutex<HashSet<u16>>>,
    /// Slot ranges each master served when it was last killed or stalled, for
    /// [`RedisCluster::wait_for_failover`].
    slots_at_fault: Mutex<HashMap<u16, Vec<(u16, u16)>>>,
}

/// A node's place in one view of the cluster: master or not, the port of its master,
/// the slots it serves. Two live nodes agree when their views map every port alike.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Role {
    master: bool,
    follows: Option<u16>,
    slots: Vec<(u16, u16)>,
}

/// One line of `CLUSTER NODES`, as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    /// Flagged `fail` or `fail?` by the node asked.
    failing: bool,
    /// Node id of the master, for a replica.
    master_id: Option<String>,
    /// Slot ranges served (importing/migrating entries left out).
    slots: Vec<(u16, u16)>,
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
        Self::start_spec(ClusterSpec {
            persistence,
            ..ClusterSpec::masters(masters)
        })
    }

    /// `masters` masters with `replicas_per_master` replicas each
    /// ([`ClusterSpec::replicated`]: node timeout 1000 ms). Returns once
    /// `cluster_state:ok` holds on every node, every node sees the same slots and roles,
    /// and every replica reports `master_link_status:up` (its first sync done).
    pub fn start_replicated(
        masters: usize,
        replicas_per_master: usize,
        persistence: Persistence,
    ) -> Self {
        Self::start_spec(ClusterSpec::replicated(
            masters,
            replicas_per_master,
            persistence,
        ))
    }

    /// A cluster as `spec` says; retried on fresh ports like [`RedisCluster::start_with`].
    ///
    /// Every node runs with `cluster-replica-validity-factor 0` (a replica however far
    /// behind may still be promoted: the lost-write case), `enable-debug-command yes`,
    /// `cluster-allow-replica-migration no` (replicas stay with the master they were
    /// given), `repl-diskless-sync-delay 0` (first syncs start at once), and AOF
    /// `everysec` when `spec.persistence` asks for it.
    pub fn start_spec(spec: ClusterSpec) -> Self {
        crate::process::with_retries("Redis Cluster", || Self::try_start(spec.clone()))
    }

    fn try_start(spec: ClusterSpec) -> Self {
        assert!((1..=16).contains(&spec.masters), "masters: 1..=16");
        assert!(spec.replicas_per_master <= 4, "replicas_per_master: 0..=4");
        let dir = tempfile::Builder::new()
            .prefix("seckill-redis-cluster-")
            .tempdir()
            .expect("tempdir");
        let masters = spec.masters;
        let total = masters * (1 + spec.replicas_per_master);
        let mut cluster = Self {
            dir,
            nodes: Vec::new(),
            spec,
            stalled: Arc::default(),
            slots_at_fault: Mutex::default(),
        };
        for _ in 0..total {
            let port = free_port(Some(10_000));
            cluster.nodes.push(Node { port, child: None });
        }
        for i in 0..total {
            cluster.start_node(i);
        }
        // Nodes 0..masters are the masters; replica k of master m is node
        // masters + m * replicas_per_master + k.
        let per = 16384 / masters;
        for i in 0..masters {
            let first = i * per;
            let last = if i + 1 == masters {
                16383
            } else {
                first + per - 1
            };
            cli(
                cluster.nodes[i].port,
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
        for r in masters..total {
            let master = cluster.nodes[(r - masters) / cluster.spec.replicas_per_master].port;
            let master_id = cli(master, &["CLUSTER", "MYID"]).trim().to_string();
            let port = cluster.nodes[r].port;
            // The replica must have learnt of its master through gossip first.
            wait_until(
                &format!("{port} to replicate {master}"),
                Duration::from_secs(20),
                || {
                    try_cli(port, &["CLUSTER", "REPLICATE", &master_id])
                        .is_some_and(|o| o.trim() == "OK")
                },
            );
        }
        cluster.wait_settled(Duration::from_secs(30));
        cluster
    }

    /// `host:port` of every node, masters and replicas: the seed list in the form the
    /// daemons' `[redis] nodes` take.
    pub fn nodes(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// Port of every node, in start order: masters first, then the replicas (replica
    /// `k` of master `m` at `masters + m * replicas_per_master + k`).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The spec the cluster was started with.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
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

    /// Runs a command on node `i` (start order) with `redis-cli` and returns its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        cli(self.nodes[i].port, args)
    }

    /// Runs a command on the node at `port` with `redis-cli` and returns its output.
    pub fn cli_at(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// Waits (up to 10 s) until every replica of `master` has everything `master`
    /// wrote: in its `INFO replication`, each `slaveN:...,offset=N,...` line reaches
    /// `master_repl_offset`. Blocks the thread (call it in `block_in_place`).
    pub fn wait_replicas_caught_up(&self, master: u16) {
        wait_until("the replicas caught up", Duration::from_secs(10), || {
            let info = self.cli_at(master, &["INFO", "replication"]);
            let own = info
                .lines()
                .find_map(|l| l.strip_prefix("master_repl_offset:"))
                .and_then(|v| v.trim().parse::<u64>().ok());
            let replicas: Vec<Option<u64>> = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("offset="))
                .map(|l| {
                    l.split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .and_then(|v| v.trim().parse().ok())
                })
                .collect();
            own.is_some() && !replicas.is_empty() && replicas.iter().all(|&o| o == own)
        });
    }

    /// `GET key` on the node at `port` after `READONLY`, so a replica answers from its
    /// own copy instead of redirecting: `None` when the key is missing there. Panics when
    /// the node neither serves nor replicates the key's slot.
    pub fn get_on(&self, port: u16, key: &str) -> Option<String> {
        let out = cli_stdin(port, &format!("READONLY\nGET {key}\n"));
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("OK"), "READONLY on {port}: {out}");
        let value = lines.next().filter(|v| !v.is_empty()).map(str::to_string);
        assert!(
            !value.as_deref().is_some_and(|v| v.starts_with("MOVED ")),
            "{port} neither serves nor replicates the slot of {key}: {out}"
        );
        value
    }

    /// FLUSHALL on every master: Redis loses every key, as after a restart without data
    /// (replicas follow their masters).
    pub fn flush_all(&self) {
        for port in self.masters() {
            cli(port, &["FLUSHALL"]);
        }
    }

    /// Kills node `i` (start order; SIGKILL). See [`RedisCluster::kill`].
    pub fn kill_node(&mut self, i: usize) {
        self.kill(self.nodes[i].port);
    }

    /// Starts node `i` (start order) again. See [`RedisCluster::restart`].
    pub fn restart_node(&mut self, i: usize) {
        self.restart(self.nodes[i].port);
    }

    /// Kills the node at `port` (SIGKILL, no shutdown: what it had not yet written to its
    /// AOF is gone). Killing a dead node does nothing. Remembers the slots it served,
    /// for [`RedisCluster::wait_for_failover`].
    pub fn kill(&mut self, port: u16) {
        let i = self.index(port);
        if self.nodes[i].child.is_none() {
            return;
        }
        self.remember_slots(port);
        if let Some(mut c) = self.nodes[i].child.take() {
            c.kill();
        }
        self.stalled.lock().expect("stalled set").remove(&port);
    }

    /// Starts the node at `port` again on the same port with the same files (its
    /// `nodes.conf`, and its AOF when persistence is on; it is killed first if it
    /// runs), and waits until the cluster has settled (`cluster_state:ok` on every live
    /// node, every one seeing the same slots and roles, every replica's link up). A
    /// former master whose slots moved to its replica meanwhile rejoins as that
    /// replica's replica; one whose slots did not move serves them again (empty without
    /// persistence).
    pub fn restart(&mut self, port: u16) {
        self.restart_all(&[port]);
    }

    /// Starts the nodes at `ports` again (see [`RedisCluster::restart`]), all of them
    /// before waiting once for the cluster to settle. Bringing back a whole cluster one
    /// node at a time cannot settle: the first master back is alone, a minority, and
    /// its state stays `fail` until the others come; and two back before the third
    /// flag it `FAIL` (a majority of masters), which fails its slots too.
    pub fn restart_all(&mut self, ports: &[u16]) {
        for &port in ports {
            self.kill(port);
            self.start_node(self.index(port));
        }
        self.wait_settled(Duration::from_secs(30));
    }

    /// Stops the node at `port` for `ms` milliseconds with SIGSTOP, and resumes it with
    /// SIGCONT from a background thread; returns at once, with the node already stopped.
    ///
    /// A stalled replica reads nothing from its master: writes pile up unreplicated and
    /// `WAIT` on the master times out, while the master keeps answering: the lagging
    /// replica of the failover tests. SIGSTOP rather than `DEBUG SLEEP`, because a
    /// `DEBUG SLEEP` sent from a thread starts at some unknown moment after this call
    /// returns, and a write sent meanwhile might still replicate; with SIGSTOP the stall
    /// has begun when the call returns. (`enable-debug-command` is on, so a test that
    /// wants the server-side sleep can send `DEBUG SLEEP` with [`RedisCluster::cli_at`].)
    /// A stall longer than the node timeout makes the others flag the node failing: a
    /// stalled master is then failed over. Harness calls skip a stalled node.
    pub fn stall(&self, port: u16, ms: u64) -> Stall {
        let i = self.index(port);
        let pid = self.nodes[i]
            .child
            .as_ref()
            .and_then(ChildGuard::id)
            .unwrap_or_else(|| panic!("stall: node {port} is not running"));
        self.remember_slots(port);
        self.stalled.lock().expect("stalled set").insert(port);
        signal(pid, "STOP");
        let stalled = Arc::clone(&self.stalled);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            // The node may have been killed meanwhile; the signal then goes nowhere.
            signal(pid, "CONT");
            stalled.lock().expect("stalled set").remove(&port);
        });
        Stall {
            thread: Some(thread),
            until: std::time::Instant::now() + Duration::from_millis(ms),
        }
    }

    /// Starts `MONITOR` on the node at `port`: every command it runs from now on, until
    /// [`Monitor::stop`] (at most a minute).
    pub fn monitor(&self, port: u16) -> Monitor {
        let mut child = redis_cli("60", port)
            .arg("monitor")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-cli monitor");
        let mut out = child.stdout.take().expect("stdout");
        // Read as it comes, so the pipe never fills and stalls the node's output.
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut text);
            text
        });
        // MONITOR answers OK once it is on; commands sent before that are not seen.
        wait_until("MONITOR is on", Duration::from_secs(10), || {
            cli(port, &["CLIENT", "LIST", "TYPE", "normal"]).contains("cmd=monitor")
        });
        Monitor {
            child,
            reader: Some(reader),
        }
    }

    /// The failover to a lagging replica: kills `master` while `stall` still stops its
    /// replica `replica` (a second of it left at least, asserted, so nothing the master
    /// wrote meanwhile reached it), waits up to 40 s for the failover, asserts that
    /// `replica` took over, and waits out the stall. Blocks the thread (call it in
    /// `block_in_place`).
    pub fn fail_over_to_stalled_replica(&mut self, master: u16, replica: u16, stall: Stall) {
        assert!(
            stall.until > std::time::Instant::now() + Duration::from_secs(1),
            "the replica must still be stopped when its master dies"
        );
        self.kill(master);
        let promoted = self.wait_for_failover(master, Duration::from_secs(40));
        assert_eq!(promoted, replica, "the lagging replica took over");
        stall.join();
    }

    /// Waits until another node serves every slot `old_master` served (the slots it held
    /// when [`RedisCluster::kill`] or [`RedisCluster::stall`] last hit it, else the ones
    /// it holds now), every live
    /// node but `old_master` agrees on it, and reports `cluster_state:ok`; returns the
    /// new master's port. Panics naming the state it saw when `timeout` passes first.
    pub fn wait_for_failover(&self, old_master: u16, timeout: Duration) -> u16 {
        let remembered = self
            .slots_at_fault
            .lock()
            .expect("slots")
            .get(&old_master)
            .cloned();
        let slots = remembered.unwrap_or_else(|| {
            self.view_from_any(&[old_master])
                .and_then(|v| v.into_iter().find(|n| n.port == old_master))
                .map(|n| n.slots)
                .unwrap_or_default()
        });
        assert!(
            !slots.is_empty(),
            "wait_for_failover: {old_master} serves no slots and was not killed as a master"
        );
        let mut last = String::new();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let survivors: Vec<u16> = self
                .live_ports()
                .into_iter()
                .filter(|&p| p != old_master)
                .collect();
            let mut owners = HashSet::new();
            let mut ok = !survivors.is_empty();
            for &p in &survivors {
                let state_ok = try_cli(p, &["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"));
                let view = try_cli(p, &["CLUSTER", "NODES"]).map(|t| parse_nodes(&t));
                let owner = view.as_ref().and_then(|v| owner_of_all(v, &slots));
                last = format!("{p}: state ok {state_ok}, owner {owner:?}");
                match owner {
                    Some(o) if state_ok && o != old_master => {
                        owners.insert(o);
                    }
                    _ => ok = false,
                }
            }
            if let (true, [m]) = (ok, owners.iter().collect::<Vec<_>>().as_slice()) {
                return **m;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no failover of {old_master} (slots {slots:?}) within {timeout:?}; last seen {last}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Records the slots `port` serves now, when it is a master, as a live node sees it.
    fn remember_slots(&self, port: u16) {
        if let Some(me) = self
            .view_from_any(&[])
            .and_then(|v| v.into_iter().find(|n| n.port == port))
        {
            if me.master && !me.slots.is_empty() {
                self.slots_at_fault
                    .lock()
                    .expect("slots")
                    .insert(port, me.slots);
            }
        }
    }

    /// Calls served by the cluster's primaries so far, by command (`get`, `evalsha`,
    /// ...), but `INFO` (the harness' own reads of these counts).
    pub fn command_counts(&self) -> HashMap<String, u64> {
        let mut out = HashMap::new();
        for port in self.masters() {
            let stats = self.cli_at(port, &["INFO", "commandstats"]);
            for line in stats.lines() {
                let Some((name, rest)) = line.trim().split_once(':') else {
                    continue;
                };
                let Some(name) = name.strip_prefix("cmdstat_") else {
                    continue;
                };
                if name == "info" {
                    continue;
                }
                let calls = rest
                    .split("calls=")
                    .nth(1)
                    .and_then(|c| c.split(',').next())
                    .and_then(|c| c.parse::<u64>().ok())
                    .unwrap_or(0);
                *out.entry(name.to_string()).or_default() += calls;
            }
        }
        out
    }

    /// Ports of the nodes serving slots now, as a live node sees it.
    pub fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = self
            .view()
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        m.sort_unstable();
        m
    }

    /// The hash slot of `key` (hash tags respected).
    pub fn slot_of(key: &str) -> u16 {
        fred::util::redis_keyslot(key.as_bytes())
    }

    /// Port of the master serving `slot` now, as a live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        owner_of_all(&self.view(), &[(slot, slot)])
            .unwrap_or_else(|| panic!("no node serves slot {slot}"))
    }

    /// Port of the master serving `key` now.
    pub fn master_of_key(&self, key: &str) -> u16 {
        self.master_of_slot(Self::slot_of(key))
    }

    /// Port of the master the replica at `replica` follows; panics if it is a master.
    pub fn master_of(&self, replica: u16) -> u16 {
        let view = self.view();
        let me = view
            .iter()
            .find(|n| n.port == replica)
            .unwrap_or_else(|| panic!("{replica} is not a node of this cluster"));
        let id = me
            .master_id
            .as_ref()
            .unwrap_or_else(|| panic!("{replica} is a master, not a replica"));
        view.iter()
            .find(|n| &n.id == id)
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("the master of {replica} is unknown"))
    }

    /// Ports of the replicas following the master at `master` now (sorted).
    pub fn replicas_of(&self, master: u16) -> Vec<u16> {
        let view = self.view();
        let Some(id) = view.iter().find(|n| n.port == master).map(|n| n.id.clone()) else {
            panic!("{master} is not a node of this cluster")
        };
        let mut r: Vec<u16> = view
            .iter()
            .filter(|n| n.master_id.as_ref() == Some(&id))
            .map(|n| n.port)
            .collect();
        r.sort_unstable();
        r
    }

    /// Waits until the cluster has settled: every live node (neither killed nor
    /// stalled) answers `cluster_state:ok`, knows every node, sees every live node as
    /// healthy, and agrees with the others on who serves which slots and who replicates
    /// whom; and every live replica reports `master_link_status:up`.
    pub fn wait_settled(&self, timeout: Duration) {
        let total = self.nodes.len();
        let deadline = std::time::Instant::now() + timeout;
        while let Err(why) = self.settled(total) {
            assert!(
                std::time::Instant::now() < deadline,
                "the cluster did not settle within {timeout:?}: {why} (files in {})",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn settled(&self, total: usize) -> Result<(), String> {
        let live = self.live_ports();
        let mut agreed: Option<BTreeMap<u16, Role>> = None;
        for &p in &live {
            let info = try_cli(p, &["CLUSTER", "INFO"]).ok_or(format!("{p} does not answer"))?;
            if !info.contains("cluster_state:ok")
                || !info.contains(&format!("cluster_known_nodes:{total}\r"))
                    && !info.contains(&format!("cluster_known_nodes:{total}\n"))
            {
                return Err(format!("{p}: not ok or not every node known"));
            }
            let view = parse_nodes(
                &try_cli(p, &["CLUSTER", "NODES"]).ok_or(format!("{p} does not answer"))?,
            );
            let by_id: HashMap<&str, u16> = view.iter().map(|n| (n.id.as_str(), n.port)).collect();
            for &q in &live {
                match view.iter().find(|n| n.port == q) {
                    Some(n) if !n.failing => {}
                    _ => return Err(format!("{p} does not see {q} as healthy")),
                }
            }
            let canonical: BTreeMap<_, _> = view
                .iter()
                .map(|n| {
                    let master = n.master_id.as_deref().and_then(|id| by_id.get(id).copied());
                    let role = Role {
                        master: n.master,
                        follows: master,
                        slots: n.slots.clone(),
                    };
                    (n.port, role)
                })
                .collect();
            match &agreed {
                None => agreed = Some(canonical),
                Some(a) if *a == canonical => {}
                Some(_) => return Err(format!("{p} sees other roles or slots")),
            }
            if view.iter().any(|n| n.port == p && !n.master) {
                let repl =
                    try_cli(p, &["INFO", "replication"]).ok_or(format!("{p} does not answer"))?;
                if !repl.contains("master_link_status:up") {
                    return Err(format!("replica {p}: link to its master not up"));
                }
            }
        }
        Ok(())
    }

    /// The cluster as the first live node that answers sees it.
    fn view(&self) -> Vec<NodeLine> {
        self.view_from_any(&[])
            .unwrap_or_else(|| panic!("no live node of the cluster answers CLUSTER NODES"))
    }

    fn view_from_any(&self, except: &[u16]) -> Option<Vec<NodeLine>> {
        self.live_ports()
            .into_iter()
            .filter(|p| !except.contains(p))
            .find_map(|p| try_cli(p, &["CLUSTER", "NODES"]))
            .map(|t| parse_nodes(&t))
    }

    /// Nodes that run and are not stalled.
    fn live_ports(&self) -> Vec<u16> {
        let stalled = self.stalled.lock().expect("stalled set").clone();
        self.nodes
            .iter()
            .filter(|n| n.child.is_some() && !stalled.contains(&n.port))
            .map(|n| n.port)
            .collect()
    }

    fn index(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("{port} is not a node of this cluster"))
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
            .arg("--cluster-node-timeout")
            .arg(self.spec.node_timeout_ms.to_string())
            .args(["--cluster-replica-validity-factor", "0"])
            .args(["--cluster-allow-replica-migration", "no"])
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--enable-debug-command", "yes"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(&dir);
        match self.spec.persistence {
            Persistence::None => cmd.args(["--appendonly", "no"]),
            Persistence::AofEverySec => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"])
            }
        };
        if let Some(m) = self.spec.min_replicas {
            cmd.arg("--min-replicas-to-write")
                .arg(m.to_write.to_string())
                .arg("--min-replicas-max-lag")
                .arg(m.max_lag_secs.to_string());
        }
        let child = ChildGuard::spawn(&format!("redis-{port}"), cmd, &dir.join("redis.log"))
            .expect("spawn redis-server");
        self.nodes[i].child = Some(child);
        wait_until(
            &format!("redis-server on {port}"),
            Duration::from_secs(10),
            || port_open(port) && try_cli(port, &["PING"]).is_some_and(|o| o.contains("PONG")),
        );
    }

    /// Directory holding the nodes' files (logs, AOF), for debugging a failed test.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// A node stopped by [`RedisCluster::stall`]; it resumes on its own when the stall's
/// time is up, whether or not this handle is kept.
#[derive(Debug)]
pub struct Stall {
    thread: Option<JoinHandle<()>>,
    /// When the node stops resuming.
    until: std::time::Instant,
}

impl Stall {
    /// Blocks until the node has been resumed.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            t.join().expect("stall thread");
        }
    }
}

/// A `MONITOR` of one node ([`RedisCluster::monitor`]).
#[derive(Debug)]
pub struct Monitor {
    child: std::process::Child,
    reader: Option<JoinHandle<String>>,
}

impl Monitor {
    /// Ends it; the commands seen, one per line as `MONITOR` prints them.
    pub fn stop(mut self) -> String {
        // `timeout` passes TERM on to redis-cli (a KILL would leave redis-cli running
        // and the pipe open).
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
        self.reader
            .take()
            .map(|r| r.join().expect("monitor reader"))
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
    }
}

/// The node that serves every range in `slots` in `view`, if one does.
fn owner_of_all(view: &[NodeLine], slots: &[(u16, u16)]) -> Option<u16> {
    let owner_of = |slot: u16| {
        view.iter()
            .find(|n| n.master && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .map(|n| n.port)
    };
    let first = owner_of(slots.first()?.0)?;
    slots
        .iter()
        .all(|&(a, b)| owner_of(a) == Some(first) && owner_of(b) == Some(first))
        .then_some(first)
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot>...`. Nodes still in handshake are left
/// out.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let flags: Vec<&str> = f[2].split(',').collect();
            if flags.contains(&"handshake") {
                return None;
            }
            let addr = f[1].split(['@', ',']).next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failing: flags.contains(&"fail") || flags.contains(&"fail?"),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            })
        })
        .collect()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
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

/// Longest a `redis-cli` call the harness makes may take: a stopped or wedged node fails
/// the call instead of hanging the test.
const CLI_TIME_LIMIT: &str = "10";
/// The same for the polls of readiness waits, which simply try again.
const POLL_TIME_LIMIT: &str = "2";

fn redis_cli(limit: &str, port: u16) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args([
        limit,
        "redis-cli",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]);
    cmd
}

fn cli(port: u16, args: &[&str]) -> String {
    crate::process::run_ok(redis_cli(CLI_TIME_LIMIT, port).args(args))
}

fn cli_stdin(port: u16, input: &str) -> String {
    use std::io::Write;
    let mut child = redis_cli(CLI_TIME_LIMIT, port)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write to redis-cli");
    let out = child.wait_with_output().expect("redis-cli");
    assert!(
        out.status.success(),
        "redis-cli on {port} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = redis_cli(POLL_TIME_LIMIT, port)
        .args(args)
        .stdin(Stdio::null())
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

/// The first user id `<prefix>-<n>` (n = 0, 1, ...) whose home is `shard` of `shards`.
pub fn user_on_shard(prefix: &str, shard: u32, shards: u32) -> String {
    (0..)
        .map(|n| format!("{prefix}-{n}"))
        .find(|u| seckill_lua::home_shard(u, shards) == shard)
        .expect("some user id lands on every shard")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse_into_roles_masters_and_slots() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002,host2 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003 master,fail? - 0 1426238318243 3 connected 10923-16383 [100->-e7d1]
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7
aaaa 127.0.0.1:30009@40009 handshake - 0 0 0 connected
";
        let v = parse_nodes(text);
        assert_eq!(v.len(), 4, "the handshake node is left out");
        assert_eq!(v[0].port, 30004);
        assert!(!v[0].master);
        assert_eq!(v[0].master_id.as_deref(), Some("e7d1"));
        assert_eq!(v[1].port, 30002);
        assert_eq!(v[1].slots, vec![(5461, 10922)]);
        assert!(v[2].failing);
        assert_eq!(v[2].slots, vec![(10923, 16383)]);
        assert_eq!(v[3].slots, vec![(0, 5460), (7, 7)]);
        assert_eq!(owner_of_all(&v, &[(0, 10), (7, 7)]), Some(30001));
        assert_eq!(owner_of_all(&v, &[(0, 5460), (5461, 5461)]), None);
    }
}
