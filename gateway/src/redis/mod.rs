//! The Redis feeds: everything the edge knows about activities, stock and bans, kept
//! in memory so that no request waits on Redis.
//!
//! [`Feeds`] is a pingora background service. On the default cluster (`redis.nodes`,
//! the fleet's control plane) it
//! - reads `SMEMBERS keys::ACTIVITIES` and every `HGETALL keys::meta(a)` into the
//!   [`Catalog`](crate::sold_out::Catalog), again on every `keys::ACTIVITIES_CHANNEL`
//!   message and every `redis.refresh_ms`;
//! - follows `keys::BANS_CHANNEL`, and reloads `HGETALL keys::BANS` with the activities;
//! - writes our auto-bans (HSET + PUBLISH) and drops expired bans from the hash;
//! - sweeps idle token buckets.
//!
//! And it runs one [`stock::StockFeed`] per cluster, the default one and each of
//! `[redis.clusters]`, each over the activities placed there: every shard's
//! `keys::stock` of every item in one pipeline every `redis.stock_poll_ms` (sold-out
//! flags and the admission cap's "remaining"), right after, for the items found empty,
//! every shard's `keys::buyers` (HKEYS): the users who hold a unit, whose resends the
//! sold-out short-circuit lets through; and `keys::SOLD_OUT_CHANNEL` on that cluster.
//! A sold-out message or answer asks the activity's cluster for this read at once.
//! An activity placed on a cluster not configured here is read by nobody (warned once,
//! `gateway_activities_on_unknown_cluster`): no short-circuit, stockd answers.

mod stock;

use crate::shared::Shared;
use crate::sold_out::Meta;
use async_trait::async_trait;
use fred::prelude::*;
use fred::types::config::ReconnectPolicy;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use seckill_lua::clock::unix_ms;
use seckill_lua::keys;
use seckill_lua::messages::BanChange;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

/// The background service.
pub struct Feeds {
    shared: Arc<Shared>,
    announce: Mutex<Option<mpsc::Receiver<BanChange>>>,
    /// (activity, cluster) pairs already warned about: placed on a cluster missing
    /// from `[redis.clusters]`.
    unknown: std::sync::Mutex<BTreeSet<(u64, String)>>,
}

impl Feeds {
    pub fn new(shared: Arc<Shared>, announce: mpsc::Receiver<BanChange>) -> Self {
        Self {
            shared,
            announce: Mutex::new(Some(announce)),
            unknown: Default::default(),
        }
    }
}

/// A fred client for the default cluster (`redis.nodes`): catalog, bans, rooms,
/// challenges and fleet budgets.
pub fn client(cfg: &crate::config::Redis) -> Result<Client, Error> {
    client_on(cfg, &cfg.nodes)
}

/// A fred client for `nodes` with the rest of `[redis]` (cluster mode, timeouts).
fn client_on(cfg: &crate::config::Redis, nodes: &[String]) -> Result<Client, Error> {
    let hosts: Vec<(String, u16)> = nodes
        .iter()
        .filter_map(|n| {
            let (h, p) = n.rsplit_once(':')?;
            Some((h.to_string(), p.parse().ok()?))
        })
        .collect();
    let server = if cfg.cluster {
        ServerConfig::new_clustered(hosts)
    } else {
        let (h, p) = hosts
            .into_iter()
            .next()
            .unwrap_or(("127.0.0.1".into(), 6379));
        ServerConfig::new_centralized(h, p)
    };
    let config = Config {
        server,
        ..Default::default()
    };
    let timeout = Duration::from_millis(cfg.timeout_ms);
    Builder::from_config(config)
        .with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
            c.max_command_attempts = 2;
        })
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .set_policy(ReconnectPolicy::new_constant(0, 300))
        .build()
}

/// Reads every published activity.
async fn load_activities(c: &Client) -> Result<Vec<Meta>, Error> {
    let ids: Vec<String> = c.smembers(keys::ACTIVITIES).await?;
    let mut metas = Vec::with_capacity(ids.len());
    for id in ids {
        let Ok(a) = id.parse::<u64>() else { continue };
        let fields: HashMap<String, String> = c.hgetall(keys::meta(a)).await?;
        match Meta::parse(a, &fields) {
            Some(m) => metas.push(m),
            None => tracing::warn!(activity = a, "incomplete meta hash; skipped"),
        }
    }
    Ok(metas)
}

async fn load_bans(c: &Client, shared: &Shared) -> Result<(), Error> {
    let all: HashMap<String, String> = c.hgetall(keys::BANS).await?;
    let now = unix_ms();
    let mut bans = Vec::with_capacity(all.len());
    let mut expired = Vec::new();
    for (cidr, v) in all {
        let exp = v
            .split('|')
            .next()
            .and_then(|e| e.parse::<u64>().ok())
            .unwrap_or(0);
        if exp != 0 && exp <= now {
            expired.push(cidr);
            continue;
        }
        if let Some(net) = crate::config::parse_cidr(&cidr) {
            bans.push((net, exp));
        }
    }
    shared.bans.replace_all(bans, now);
    if !expired.is_empty() {
        let _: () = c.hdel(keys::BANS, expired).await?;
    }
    Ok(())
}

async fn announce(c: &Client, change: &BanChange) -> Result<(), Error> {
    if let BanChange::Ban {
        cidr,
        expires_at_ms,
        reason,
    } = change
    {
        let _: () = c
            .hset(
                keys::BANS,
                (
                    cidr.as_str(),
                    BanChange::stored_value(*expires_at_ms, reason),
                ),
            )
            .await?;
    }
    let _: () = c.publish(keys::BANS_CHANNEL, change.encode()).await?;
    Ok(())
}

/// A client for `nodes` once connected (`cluster` names them in logs); `None` on
/// shutdown or a config fred refuses. fred does not try a first connection again
/// once it failed (a cluster down, or not yet serving every slot, when the gateway
/// starts), so while it fails this makes a new client every second; once connected,
/// the client's reconnect policy takes over.
pub(crate) async fn connect(
    cfg: &crate::config::Redis,
    nodes: &[String],
    cluster: &str,
    shutdown: &mut ShutdownWatch,
) -> Option<Client> {
    let mut warned = false;
    loop {
        let c = match client_on(cfg, nodes) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(cluster, error = %e, "bad redis config");
                return None;
            }
        };
        match c.init().await {
            Ok(_task) => {
                if warned {
                    tracing::info!(cluster, "connected to Redis");
                }
                return Some(c);
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(cluster, error = %e, "cannot reach Redis; trying again");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.changed() => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

fn on_message(shared: &Shared, msg: &fred::types::Message, reload: &tokio::sync::Notify) {
    let Some(text) = msg.value.as_str() else {
        return;
    };
    match &*msg.channel {
        keys::BANS_CHANNEL => {
            if let Some(change) = BanChange::parse(&text) {
                shared.bans.apply(&change);
            }
        }
        keys::ACTIVITIES_CHANNEL => reload.notify_one(),
        _ => {}
    }
}

#[async_trait]
impl BackgroundService for Feeds {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let shared = self.shared.clone();
        let cfg = shared.cfg.redis.clone();
        let Some(mut announce_rx) = self.announce.lock().await.take() else {
            return;
        };
        // The stock feeds, one per cluster, each on its own (their wake-ups exist before
        // the first refresh asks them for a read).
        let clusters = std::iter::once((None, cfg.nodes.clone())).chain(
            cfg.clusters
                .iter()
                .map(|(name, c)| (Some(name.clone()), c.nodes.clone())),
        );
        for (cluster, nodes) in clusters {
            let feed = stock::StockFeed {
                shared: shared.clone(),
                wake: shared.catalog.stock_reads(cluster.as_deref()),
                cluster,
                nodes,
            };
            tokio::spawn(feed.run(shutdown.clone()));
        }
        tokio::spawn(sweep(shared.clone(), shutdown.clone()));
        let reload = Arc::new(tokio::sync::Notify::new());
        follow_control(&shared, &reload, shutdown.clone());
        let default = seckill_daemon::config::DEFAULT_CLUSTER;
        let Some(c) = connect(&cfg, &cfg.nodes, default, &mut shutdown).await else {
            return;
        };
        let mut refresh = tokio::time::interval(Duration::from_millis(cfg.refresh_ms));
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = refresh.tick() => self.refresh(&c).await,
                _ = reload.notified() => self.refresh(&c).await,
                Some(change) = announce_rx.recv() => {
                    shared.metrics.auto_bans.inc();
                    if let Err(e) = announce(&c, &change).await {
                        tracing::warn!(error = %e, "could not share an auto-ban");
                    }
                }
            }
        }
        let _ = c.quit().await;
    }
}

/// Sweeps idle token buckets and bans every 5 s, whatever Redis does.
async fn sweep(shared: Arc<Shared>, mut shutdown: ShutdownWatch) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
        }
        let now = shared.now_ms();
        let policy = shared.policy();
        shared.limiter.evict_idle(&policy.limits, now);
        shared.bans.evict_idle(now, unix_ms());
        shared
            .metrics
            .tracked_ips
            .set(shared.limiter.tracked_ips() as i64);
    }
}

/// Follows `keys::BANS_CHANNEL` and `keys::ACTIVITIES_CHANNEL` on the default cluster
/// with a client of its own, resubscribed (and the catalog reloaded) after every
/// reconnect.
fn follow_control(
    shared: &Arc<Shared>,
    reload: &Arc<tokio::sync::Notify>,
    mut shutdown: ShutdownWatch,
) {
    let (shared, reload) = (shared.clone(), reload.clone());
    let channels = || vec![keys::BANS_CHANNEL, keys::ACTIVITIES_CHANNEL];
    tokio::spawn(async move {
        let cfg = &shared.cfg.redis;
        let default = seckill_daemon::config::DEFAULT_CLUSTER;
        let Some(sub) = connect(cfg, &cfg.nodes, default, &mut shutdown).await else {
            return;
        };
        let mut rx = sub.message_rx();
        let mut reconnects = sub.reconnect_rx();
        if let Err(e) = sub.subscribe(channels()).await {
            tracing::warn!(error = %e, "subscribe failed; relying on polling");
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                msg = rx.recv() => match msg {
                    Ok(msg) => on_message(&shared, &msg, &reload),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(n, "pub/sub lagged; reloading");
                        reload.notify_one();
                    }
                    Err(_) => break,
                },
                again = reconnects.recv() => {
                    if again.is_err() {
                        break;
                    }
                    let _ = sub.subscribe(channels()).await;
                    reload.notify_one();
                }
            }
        }
        let _ = sub.quit().await;
    });
}

impl Feeds {
    async fn refresh(&self, c: &Client) {
        let shared = &self.shared;
        match load_activities(c).await {
            Ok(metas) => {
                self.check_placement(&metas);
                shared.catalog.replace(metas);
                shared.catalog.want_all_reads();
            }
            Err(e) => {
                shared.metrics.catalog_refresh_errors.inc();
                tracing::warn!(error = %e, "could not read activities from Redis");
            }
        }
        if let Err(e) = load_bans(c, shared).await {
            shared.metrics.catalog_refresh_errors.inc();
            tracing::warn!(error = %e, "could not read bans from Redis");
        }
    }

    /// Warns once per (activity, cluster) about an activity placed on a cluster this
    /// gateway is not configured with (nobody reads its stock: no short-circuit), and
    /// sets `gateway_activities_on_unknown_cluster`.
    fn check_placement(&self, metas: &[Meta]) {
        let known = &self.shared.cfg.redis.clusters;
        let now: BTreeSet<(u64, String)> = metas
            .iter()
            .filter_map(|m| Some((m.id, m.cluster.clone()?)))
            .filter(|(_, c)| !known.contains_key(c))
            .collect();
        let mut warned = self.unknown.lock().unwrap_or_else(|p| p.into_inner());
        for (a, cluster) in now.difference(&warned) {
            tracing::warn!(
                activity = a,
                cluster = %cluster,
                "activity placed on a Redis Cluster missing from [redis.clusters]; \
                 no sold-out short-circuit for it (stockd answers its requests)"
            );
        }
        self.shared
            .metrics
            .activities_on_unknown_cluster
            .set(now.len() as i64);
        *warned = now;
    }
}
