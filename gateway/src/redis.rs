//! The Redis feeds: everything the edge knows about activities, stock and bans, kept
//! in memory so that no request waits on Redis.
//!
//! [`Feeds`] is a pingora background service. It
//! - reads `SMEMBERS keys::ACTIVITIES` and every `HGETALL keys::meta(a)` into the
//!   [`Catalog`](crate::sold_out::Catalog), again on every `keys::ACTIVITIES_CHANNEL`
//!   message and every `redis.refresh_ms`;
//! - reads every shard's `keys::stock` of every item in one pipeline every
//!   `redis.stock_poll_ms` (sold-out flags and the admission cap's "remaining"), and
//!   right after, for the items found empty, every shard's `keys::buyers` (HKEYS): the
//!   users who hold a unit, whose resends the sold-out short-circuit lets through.
//!   A sold-out message or answer asks for this read at once;
//! - follows `keys::SOLD_OUT_CHANNEL` and `keys::BANS_CHANNEL`, and reloads
//!   `HGETALL keys::BANS` with the activities;
//! - writes our auto-bans (HSET + PUBLISH) and drops expired bans from the hash;
//! - sweeps idle token buckets.

use crate::shared::Shared;
use crate::sold_out::{Holders, Meta};
use async_trait::async_trait;
use fred::prelude::*;
use fred::types::config::ReconnectPolicy;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use seckill_lua::clock::unix_ms;
use seckill_lua::keys;
use seckill_lua::messages::{BanChange, SoldOut};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

/// The background service.
pub struct Feeds {
    shared: Arc<Shared>,
    announce: Mutex<Option<mpsc::Receiver<BanChange>>>,
}

impl Feeds {
    pub fn new(shared: Arc<Shared>, announce: mpsc::Receiver<BanChange>) -> Self {
        Self {
            shared,
            announce: Mutex::new(Some(announce)),
        }
    }
}

/// A fred client for the configured nodes.
pub fn client(cfg: &crate::config::Redis) -> Result<Client, Error> {
    let hosts: Vec<(String, u16)> = cfg
        .nodes
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

/// One pipeline of GETs over every shard stock key of every item, then one of HKEYS
/// over every shard buyers hash of the items found empty.
///
/// The holders are read after the stock on purpose: a unit is taken and its buyer
/// recorded in one Lua call, so every unit gone by the stock read has its holder in
/// the hashes by the holders read (unless it was returned meanwhile, and then its
/// holder holds nothing). The read is repeated on every poll while the item stays
/// sold out, so every edge follows returns and re-sales from the same hashes; its size
/// is bounded by the item's stock.
async fn poll_stock(c: &Client, shared: &Shared) -> Result<(), Error> {
    let all = shared.catalog.all();
    let now = unix_ms() as i64;
    let mut order = Vec::new();
    let mut empty = Vec::new();
    let pipe = c.pipeline();
    for act in all.values() {
        if now >= act.end_ms {
            continue;
        }
        for item in &act.items {
            for i in 0..act.shards {
                let _: () = pipe.get(keys::stock(act.id, i, item.id)).await?;
            }
            order.push((act.id, item.id, act.shards));
        }
    }
    if order.is_empty() {
        return Ok(());
    }
    let values: Vec<Value> = pipe.all().await?;
    let mut it = values.into_iter();
    for (a, s, shards) in order {
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
            shared.catalog.set_remaining(a, s, sum);
            if sum <= 0 {
                empty.push((a, s, shards));
            }
        }
    }
    if empty.is_empty() {
        return Ok(());
    }
    let pipe = c.pipeline();
    for (a, s, shards) in &empty {
        for i in 0..*shards {
            let _: () = pipe.hkeys(keys::buyers(*a, i, *s)).await?;
        }
    }
    let values: Vec<Value> = pipe.all().await?;
    let mut it = values.into_iter();
    for (a, s, shards) in empty {
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
        if complete {
            shared.catalog.set_holders(a, s, holders);
        }
    }
    Ok(())
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

fn on_message(shared: &Shared, msg: &fred::types::Message, reload: &tokio::sync::Notify) {
    let Some(text) = msg.value.as_str() else {
        return;
    };
    match &*msg.channel {
        keys::SOLD_OUT_CHANNEL => {
            if let Some(m) = SoldOut::parse(&text) {
                shared
                    .catalog
                    .report_sold_out(m.activity, m.item, m.sold_out);
            }
        }
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
        let (Ok(c), Ok(sub)) = (client(&cfg), client(&cfg)) else {
            tracing::error!("bad redis config");
            return;
        };
        // Connect (retrying until Redis is up).
        let _c_task = c.init().await;
        let _s_task = sub.init().await;
        let reload = Arc::new(tokio::sync::Notify::new());
        // Pub/sub, resubscribed after every reconnect.
        {
            let sub2 = sub.clone();
            let shared2 = shared.clone();
            let reload2 = reload.clone();
            tokio::spawn(async move {
                let mut rx = sub2.message_rx();
                loop {
                    match rx.recv().await {
                        Ok(msg) => on_message(&shared2, &msg, &reload2),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(n, "pub/sub lagged; reloading");
                            reload2.notify_one();
                        }
                        Err(_) => break,
                    }
                }
            });
            let sub3 = sub.clone();
            let reload3 = reload.clone();
            tokio::spawn(async move {
                let mut rec = sub3.reconnect_rx();
                while rec.recv().await.is_ok() {
                    let _ = sub3
                        .subscribe(vec![
                            keys::SOLD_OUT_CHANNEL,
                            keys::BANS_CHANNEL,
                            keys::ACTIVITIES_CHANNEL,
                        ])
                        .await;
                    reload3.notify_one();
                }
            });
            if let Err(e) = sub
                .subscribe(vec![
                    keys::SOLD_OUT_CHANNEL,
                    keys::BANS_CHANNEL,
                    keys::ACTIVITIES_CHANNEL,
                ])
                .await
            {
                tracing::warn!(error = %e, "subscribe failed; relying on polling");
            }
        }
        let mut refresh = tokio::time::interval(Duration::from_millis(cfg.refresh_ms));
        let mut poll = tokio::time::interval(Duration::from_millis(cfg.stock_poll_ms));
        let mut sweep = tokio::time::interval(Duration::from_secs(5));
        for t in [&mut refresh, &mut poll, &mut sweep] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = refresh.tick() => self.refresh(&c).await,
                _ = reload.notified() => self.refresh(&c).await,
                _ = poll.tick() => {
                    if let Err(e) = poll_stock(&c, &shared).await {
                        shared.metrics.catalog_refresh_errors.inc();
                        tracing::debug!(error = %e, "stock poll failed");
                    }
                }
                _ = shared.catalog.read_wanted() => {
                    if let Err(e) = poll_stock(&c, &shared).await {
                        shared.metrics.catalog_refresh_errors.inc();
                        tracing::debug!(error = %e, "stock poll failed");
                    }
                }
                Some(change) = announce_rx.recv() => {
                    shared.metrics.auto_bans.inc();
                    if let Err(e) = announce(&c, &change).await {
                        tracing::warn!(error = %e, "could not share an auto-ban");
                    }
                }
                _ = sweep.tick() => {
                    let now = shared.now_ms();
                    let policy = shared.policy();
                    shared.limiter.evict_idle(&policy.limits, now);
                    shared.bans.evict_idle(now, unix_ms());
                    shared.metrics.tracked_ips.set(shared.limiter.tracked_ips() as i64);
                }
            }
        }
        let _ = c.quit().await;
        let _ = sub.quit().await;
    }
}

impl Feeds {
    async fn refresh(&self, c: &Client) {
        let shared = &self.shared;
        match load_activities(c).await {
            Ok(metas) => {
                shared.catalog.replace(metas);
                if let Err(e) = poll_stock(c, shared).await {
                    tracing::debug!(error = %e, "stock poll failed");
                }
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
}
