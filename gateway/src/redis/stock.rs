//! The stock feed of one Redis Cluster: the default one, or a named one
//! (`[redis.clusters.<name>]`) that activities are placed on.
//!
//! Each feed is its own task with its own clients, and reads only the activities placed
//! on its cluster ([`Activity::cluster`](crate::sold_out::Activity::cluster)), so a dead
//! or slow cluster stalls its own activities' flags (they stay as last read) and nobody
//! else's. A feed
//! - reads every shard's `keys::stock` of every open item on its cluster in one pipeline
//!   every `redis.stock_poll_ms`, then `keys::buyers` (HKEYS) of the items found empty
//!   ([`poll_stock`]);
//! - follows `keys::SOLD_OUT_CHANNEL` on its cluster (where stockd publishes about the
//!   activities placed there);
//! - reads at once when asked through its [`Notify`]
//!   ([`Catalog::stock_reads`](crate::sold_out::Catalog::stock_reads)): a sold-out
//!   message or answer about one of its activities, a catalog refresh, a reconnect.

use crate::shared::Shared;
use crate::sold_out::Holders;
use fred::prelude::*;
use pingora::server::ShutdownWatch;
use seckill_lua::clock::unix_ms;
use seckill_lua::keys;
use seckill_lua::messages::SoldOut;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// One cluster's stock feed.
pub(super) struct StockFeed {
    pub shared: Arc<Shared>,
    /// `None`: the default cluster (`redis.nodes`).
    pub cluster: Option<String>,
    /// Seed nodes of that cluster.
    pub nodes: Vec<String>,
    /// Asks for a read now (made by `Catalog::stock_reads` before the first refresh).
    pub wake: Arc<Notify>,
}

impl StockFeed {
    /// `default` or the cluster's name, for logs and metrics.
    fn name(&self) -> &str {
        self.cluster
            .as_deref()
            .unwrap_or(seckill_daemon::config::DEFAULT_CLUSTER)
    }

    /// Runs until shutdown.
    pub async fn run(self, mut shutdown: ShutdownWatch) {
        let cfg = &self.shared.cfg.redis;
        self.follow_sold_out(shutdown.clone());
        let Some(c) = super::connect(cfg, &self.nodes, self.name(), &mut shutdown).await else {
            return;
        };
        let errors = self
            .shared
            .metrics
            .stock_poll_errors(self.cluster.as_deref());
        // A poll answers within its commands' timeouts; this only bounds a hung one.
        let limit = Duration::from_millis(cfg.timeout_ms.saturating_mul(3));
        let mut poll = tokio::time::interval(Duration::from_millis(cfg.stock_poll_ms));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut idle_cursor = (0u64, 0u64);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = poll.tick() => {}
                _ = self.wake.notified() => {}
            }
            let read = tokio::time::timeout(
                limit,
                poll_stock(&c, &self.shared, self.cluster.as_deref(), &mut idle_cursor),
            )
            .await;
            match read.unwrap_or_else(|_| Err(Error::new(ErrorKind::Timeout, "stock poll"))) {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(cluster = self.name(), "stock reads work again");
                }
                Ok(()) => {}
                Err(e) => {
                    errors.inc();
                    self.shared.metrics.catalog_refresh_errors.inc();
                    if !failing {
                        failing = true;
                        tracing::warn!(
                            cluster = self.name(),
                            error = %e,
                            "stock reads failing; the sold-out flags of this cluster's \
                             activities stay as last read"
                        );
                    } else {
                        tracing::debug!(cluster = self.name(), error = %e, "stock poll failed");
                    }
                }
            }
        }
        let _ = c.quit().await;
    }

    /// Subscribes to `keys::SOLD_OUT_CHANNEL` with a client of its own (again after
    /// every reconnect, then reading at once: messages may have been missed), in a task
    /// of its own.
    fn follow_sold_out(&self, mut shutdown: ShutdownWatch) {
        let (shared, wake) = (self.shared.clone(), self.wake.clone());
        let (name, nodes) = (self.name().to_owned(), self.nodes.clone());
        tokio::spawn(async move {
            let cfg = &shared.cfg.redis;
            let Some(sub) = super::connect(cfg, &nodes, &name, &mut shutdown).await else {
                return;
            };
            let mut rx = sub.message_rx();
            let mut reconnects = sub.reconnect_rx();
            if let Err(e) = sub.subscribe(keys::SOLD_OUT_CHANNEL).await {
                tracing::warn!(cluster = %name, error = %e, "subscribe failed; relying on polling");
            }
            loop {
                tokio::select! {
                    _ = shutdown.changed() => break,
                    msg = rx.recv() => match msg {
                        Ok(msg) => on_sold_out(&shared, &msg),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(cluster = %name, n, "pub/sub lagged; reading stock");
                            wake.notify_one();
                        }
                        Err(_) => break,
                    },
                    again = reconnects.recv() => {
                        if again.is_err() {
                            break;
                        }
                        let _ = sub.subscribe(keys::SOLD_OUT_CHANNEL).await;
                        wake.notify_one();
                    }
                }
            }
            let _ = sub.quit().await;
        });
    }
}

/// A `keys::SOLD_OUT_CHANNEL` message: the catalog asks the read of the cluster that
/// holds the activity (this one, as stockd publishes there).
fn on_sold_out(shared: &Shared, msg: &fred::types::Message) {
    if &*msg.channel != keys::SOLD_OUT_CHANNEL {
        return;
    }
    if let Some(m) = msg.value.as_str().and_then(|t| SoldOut::parse(&t)) {
        shared
            .catalog
            .report_sold_out(m.activity, m.item, m.sold_out);
    }
}

/// One pipeline of GETs over the shard stock keys of the items of the open activities
/// placed on `cluster` (`None`: the default one), then one of HKEYS over every shard
/// buyers hash of the items found empty.
///
/// Which items: every hot one ([`ItemLive::is_hot`]: a request or a sold-out message
/// within `sold_out::HOT_MS`, or never read), and the idle ones in turn, from the one
/// after `cursor` (activity, item) in id order, wrapping, until
/// `redis.stock_poll_idle_keys` keys are read. So an idle gateway reads at most that
/// many keys per poll however many activities are live, and an idle item is read again
/// within ceil(idle keys / budget) polls; its first request asks for a read at once.
/// Sold-out changes do not wait for the turn: stockd announces them on
/// `keys::SOLD_OUT_CHANNEL`, which marks the item hot and asks for a read.
///
/// The holders are read after the stock on purpose: a unit is taken and its buyer
/// recorded in one Lua call, so every unit gone by the stock read has its holder in
/// the hashes by the holders read (unless it was returned meanwhile, and then its
/// holder holds nothing). The read is repeated on every poll while the item stays
/// sold out and hot, so every edge follows returns and re-sales from the same hashes;
/// its size is bounded by the item's stock.
pub(super) async fn poll_stock(
    c: &Client,
    shared: &Shared,
    cluster: Option<&str>,
    cursor: &mut (u64, u64),
) -> Result<(), Error> {
    let all = shared.catalog.all();
    let now = unix_ms() as i64;
    let mut hot = Vec::new();
    let mut idle = Vec::new();
    for act in all.values() {
        if now >= act.end_ms || act.cluster.as_deref() != cluster {
            continue;
        }
        for item in &act.items {
            let at = (act.id, item.id, act.shards);
            if item.is_hot(now) {
                hot.push(at);
            } else {
                idle.push(at);
            }
        }
    }
    idle.sort_unstable();
    let split = idle.partition_point(|&(a, s, _)| (a, s) <= *cursor);
    let budget = u64::from(shared.cfg.redis.stock_poll_idle_keys);
    let mut keys_read = 0u64;
    let mut order = hot;
    for &at in idle[split..].iter().chain(&idle[..split]) {
        if keys_read >= budget {
            break;
        }
        keys_read += u64::from(at.2);
        *cursor = (at.0, at.1);
        order.push(at);
    }
    let mut empty = Vec::new();
    // Each item's sold-out messages so far: a message while the read runs makes its
    // result stale (`Catalog::set_remaining`).
    let seen: Vec<u64> = order
        .iter()
        .map(|&(a, s, _)| shared.catalog.news(a, s))
        .collect();
    let pipe = c.pipeline();
    for &(a, s, shards) in &order {
        for i in 0..shards {
            let _: () = pipe.get(keys::stock(a, i, s)).await?;
        }
    }
    if order.is_empty() {
        return Ok(());
    }
    let values: Vec<Value> = pipe.all().await?;
    let mut it = values.into_iter();
    for ((a, s, shards), seen) in order.into_iter().zip(seen) {
        let mut sum = 0i64;
        let mut known = true;
        for _ in 0..shards {
            match it.next().map(|v| v.as_i64()) {
                Some(Some(n)) => sum += n.max(0),
                // A missing key: the shard is not warmed (or was lost); stockd decides.
                _ => known = false,
            }
        }
        if known {
            shared.catalog.set_remaining(a, s, sum, seen);
            if sum <= 0 {
                empty.push((a, s, shards, seen));
            }
        }
    }
    if empty.is_empty() {
        return Ok(());
    }
    // With each item's buyers, its units in transit (`sk:{a:i}:transit:<s>`, live
    // records on each shard): units between a rebalancing take and its give are on no
    // shard, so an item with some in transit is not taken for sold out on this read
    // (stockd decides; the next read sees where the units landed). A move that settled
    // between the two reads is missed: its units show on the next read, which puts the
    // item back on sale. Every record counts, live or past its deadline (the deadlines
    // are Redis time; comparing them with this host's clock would let a clock ahead of
    // Redis ignore live ones): a dead mover's record holds the edge's sold-out answer
    // back until the next take on that shard sweeps it or the key expires (one
    // record's life, 2.5 s with stockd's defaults); stockd answers meanwhile.
    let pipe = c.pipeline();
    for (a, s, shards, _) in &empty {
        for i in 0..*shards {
            let _: () = pipe.hkeys(keys::buyers(*a, i, *s)).await?;
        }
        for i in 0..*shards {
            let _: () = pipe.zcard(keys::transit(*a, i, *s)).await?;
        }
    }
    let values: Vec<Value> = pipe.all().await?;
    let mut it = values.into_iter();
    for (a, s, shards, seen) in empty {
        let mut holders = Holders::new();
        let mut complete = true;
        for _ in 0..shards {
            match it.next() {
                Some(Value::Array(users)) => holders.extend(
                    users
                        .iter()
                        .filter_map(|u| u.as_str())
                        .map(|u| Box::<str>::from(u.as_ref())),
                ),
                // A missing hash is an empty one; anything else is not a read.
                Some(Value::Null) => {}
                _ => complete = false,
            }
        }
        let mut moving = 0;
        for _ in 0..shards {
            match it.next().and_then(|v| v.as_i64()) {
                Some(n) => moving += n,
                None => complete = false,
            }
        }
        if complete && moving == 0 {
            shared.catalog.set_holders(a, s, holders, seen);
        }
    }
    Ok(())
}
