//! Wake-ups of idle stream consumers, so an idle orderd costs nothing per stream.
//!
//! Polling every `sk:{a:i}:orders` stream every `consumer.block_ms` made the idle CPU
//! grow with the number of activities (one `XREADGROUP` per stream per 50 ms: 26
//! activities × 8 shards took ~6 % of a core, 1,000 activities would take several
//! cores). Reads cannot be batched (every stream is its own cluster slot, so one
//! `XREADGROUP` cannot name two of them) and cannot `BLOCK` (fred multiplexes one
//! connection per node). So orderd listens instead:
//!
//! - on every primary of the cluster, `notify-keyspace-events` gets the flags `E`
//!   (key-event channel) and `t` (stream commands), added to whatever is set there
//!   (`CONFIG SET`; with `consumer.keyspace_events = false`, or where `CONFIG` is
//!   refused, orderd polls as before);
//! - one connection per primary subscribes to `__keyevent@0__:xadd`, whose messages
//!   name the key an `XADD` wrote to; the consumer of that stream is woken
//!   ([`Wakes::wake`]);
//! - an idle consumer sleeps until woken, its claim tick (`claim_idle_ms / 2`, which
//!   also reads new entries: the safety net for a lost message) or shutdown.
//!
//! Every consumer is woken at once when a subscription is (re)established or the set
//! of primaries changes (failover): entries appended while nobody listened are read
//! then. A wake-up that finds nothing costs one empty read.
//!
//! All of this is per Redis cluster ([`crate::clusters`]): each configured cluster has
//! its own [`Wakes`] (the consumers of its streams), [`listen`] and [`sweep`], so a
//! cluster whose subscriptions are down makes only its own consumers poll.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand, Value};
use seckill_daemon::shutdown::Shutdown;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::RedisConfig;

/// The key-event channel of `XADD` (cluster nodes have only database 0).
pub const XADD_CHANNEL: &str = "__keyevent@0__:xadd";

/// The consumers' wake-up handles, by stream key; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Wakes {
    streams: Arc<RwLock<Registry>>,
    /// True while every known primary has a live subscription: idle consumers then
    /// wait for a wake-up instead of polling.
    listening: Arc<AtomicBool>,
    /// The Redis cluster these streams are on, for the logs.
    cluster: Arc<str>,
}

/// The handles by stream, and in registration order for the sweep.
#[derive(Debug, Default)]
struct Registry {
    by_stream: HashMap<String, Arc<Notify>>,
    in_order: Vec<Arc<Notify>>,
    /// The next index of `in_order` the sweep wakes.
    cursor: usize,
}

impl Wakes {
    /// The wake-ups of the consumers of `cluster`'s streams.
    pub fn for_cluster(cluster: &str) -> Self {
        Self {
            cluster: cluster.into(),
            ..Self::default()
        }
    }

    /// The handle of `stream`'s consumer (made on first use).
    pub fn register(&self, stream: &str) -> Arc<Notify> {
        let mut reg = self.streams.write().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = reg.by_stream.get(stream) {
            return n.clone();
        }
        let n = Arc::new(Notify::new());
        reg.by_stream.insert(stream.to_string(), n.clone());
        reg.in_order.push(n.clone());
        n
    }

    /// How many streams have a consumer.
    pub fn len(&self) -> usize {
        self.streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .in_order
            .len()
    }

    /// True before any consumer registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes the next consumer in turn (the clean-stream sweep, [`sweep`]).
    pub fn wake_next(&self) {
        let mut reg = self.streams.write().unwrap_or_else(|p| p.into_inner());
        if reg.in_order.is_empty() {
            return;
        }
        let i = reg.cursor % reg.in_order.len();
        reg.cursor = i + 1;
        reg.in_order[i].notify_one();
    }

    /// Wakes the consumer of `stream`, if there is one (a wake-up with nobody waiting
    /// is kept for its next wait).
    pub fn wake(&self, stream: &str) {
        tracing::trace!(stream, "woken");
        let reg = self.streams.read().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = reg.by_stream.get(stream) {
            n.notify_one();
        }
    }

    /// Wakes every consumer.
    pub fn wake_all(&self) {
        let reg = self.streams.read().unwrap_or_else(|p| p.into_inner());
        for n in &reg.in_order {
            n.notify_one();
        }
    }

    /// True while idle consumers may rely on wake-ups.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn set_listening(&self, on: bool) {
        if self.listening.swap(on, Ordering::AcqRel) != on {
            tracing::info!(cluster = %self.cluster, listening = on, "stream wake-ups");
            // Switching either way: everyone re-reads once (entries appended while
            // nobody listened, or pollers resuming).
            self.wake_all();
        }
    }
}

/// The clean-stream sweep: wakes one consumer every `step`, in turn, until shutdown. A
/// consumer whose stream is clean (nothing pending in the group, see
/// `consumer::StreamConsumer::run`) sleeps with no timer; this is its net for what the
/// wake-ups cannot see, at a fixed rate for all streams together: with 8,000 streams and
/// the default 50 ms step (`consumer.clean_sweep_ms`), each is visited every 400 s, and an idle orderd sends about three
/// stream commands per step however many activities are live.
pub async fn sweep(wakes: Wakes, step: Duration, shutdown: Shutdown) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(step) => wakes.wake_next(),
            _ = shutdown.clone().wait() => break,
        }
    }
}

/// Keeps one subscription per primary of `cluster` until shutdown, re-checking the
/// set of primaries every `every`.
pub async fn listen(
    cluster: Client,
    cfg: RedisConfig,
    wakes: Wakes,
    every: Duration,
    shutdown: Shutdown,
) {
    let mut watchers: HashMap<String, (JoinHandle<()>, Arc<AtomicBool>)> = HashMap::new();
    loop {
        let primaries: HashSet<String> = cluster
            .cached_cluster_state()
            .map(|s| {
                s.unique_primary_nodes()
                    .into_iter()
                    .map(|n| format!("{}:{}", n.host, n.port))
                    .collect()
            })
            .unwrap_or_default();
        let before = watchers.len();
        watchers.retain(|node, (task, _)| {
            let keep = primaries.contains(node) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        let mut changed = watchers.len() != before;
        for node in &primaries {
            if !watchers.contains_key(node) {
                let up = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn(watch_node(
                    cluster.clone(),
                    node.clone(),
                    cfg.clone(),
                    wakes.clone(),
                    up.clone(),
                ));
                watchers.insert(node.clone(), (task, up));
                changed = true;
            }
        }
        let all_up =
            !watchers.is_empty() && watchers.values().all(|(_, up)| up.load(Ordering::Acquire));
        wakes.set_listening(all_up);
        if changed && all_up {
            wakes.wake_all();
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.clone().wait() => break,
        }
    }
    for (_, (task, _)) in watchers {
        task.abort();
    }
}

/// One primary: enable the events, subscribe, and turn messages into wake-ups;
/// `up` says whether the subscription is live. Returns (and is restarted by
/// [`listen`]) when the node refuses `CONFIG`.
async fn watch_node(
    cluster: Client,
    node: String,
    cfg: RedisConfig,
    wakes: Wakes,
    up: Arc<AtomicBool>,
) {
    let Some((host, port)) = node
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
    else {
        return;
    };
    // The flags first, over the cluster client (a subscribed connection runs nothing
    // but (UN)SUBSCRIBE).
    if let Err(e) = enable_events(&cluster, Server::new(host.as_str(), port)).await {
        tracing::warn!(%node, error = %e, "cannot enable XADD key-events; polling");
        return;
    }
    let config = Config {
        server: ServerConfig::new_centralized(host, port),
        ..Config::default()
    };
    let client = match Builder::from_config(config)
        .with_performance_config(|p| {
            p.default_command_timeout = Duration::from_millis(cfg.timeout_ms);
        })
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_millis(cfg.connect_timeout_ms);
            c.internal_command_timeout = Duration::from_millis(cfg.connect_timeout_ms);
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 100, 2000, 2))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%node, error = %e, "cannot build the wake-up client");
            return;
        }
    };
    // fred parses key-event messages into `KeyspaceEvent`s (not `message_rx`).
    let mut messages = client.keyspace_event_rx();
    let mut reconnects = client.reconnect_rx();
    if let Err(e) = client.init().await {
        tracing::warn!(%node, error = %e, "wake-up connection failed");
        let _ = client.quit().await;
        return;
    }
    // Subscribe (again after every reconnection: a new connection has no channels).
    let mut ready = true;
    loop {
        if ready {
            ready = false;
            match client.subscribe(XADD_CHANNEL).await {
                Ok(()) => {
                    up.store(true, Ordering::Release);
                    wakes.wake_all();
                }
                Err(e) => {
                    tracing::warn!(%node, error = %e, "no stream wake-ups from this node; polling");
                    up.store(false, Ordering::Release);
                    let _ = client.quit().await;
                    return;
                }
            }
        }
        tokio::select! {
            m = messages.recv() => match m {
                Ok(m) => {
                    match m.key.as_str() {
                        Some(key) => wakes.wake(key),
                        None => tracing::debug!(%node, key = ?m.key, "unexpected key-event"),
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => wakes.wake_all(),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            r = reconnects.recv() => match r {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => ready = true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    up.store(false, Ordering::Release);
}

/// Adds `E` and `t` to `node`'s `notify-keyspace-events`.
async fn enable_events(cluster: &Client, node: Server) -> Result<(), Error> {
    let config = CustomCommand::new_static("CONFIG", ClusterHash::Random, false);
    let client = cluster.with_cluster_node(node);
    let got: Value = client
        .custom(config.clone(), vec!["GET", "notify-keyspace-events"])
        .await?;
    let flags = got
        .into_array()
        .get(1)
        .and_then(|v| v.as_string())
        .unwrap_or_default();
    let has_t = flags.contains('t') || flags.contains('A');
    if !flags.contains('E') || !has_t {
        let mut want = flags.clone();
        if !want.contains('E') {
            want.push('E');
        }
        if !has_t {
            want.push('t');
        }
        let _: Value = client
            .custom(config, vec!["SET", "notify-keyspace-events", want.as_str()])
            .await?;
    }
    Ok(())
}
