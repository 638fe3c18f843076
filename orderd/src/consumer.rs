//! The stream consumers: reservations in Redis → orders in MySQL.
//!
//! [`discover`] reads the published activities from MySQL every
//! `consumer.discovery_interval_ms` and runs one [`StreamConsumer`] per
//! `sk:{a:i}:orders` stream, against the Redis cluster the activity is placed on
//! ([`crate::clusters`]; each stream is one cluster slot, so one command per stream; the
//! streams run concurrently). Discovery itself sends nothing to Redis: each consumer
//! creates its consumer group, retrying with back-off, so a cluster that is down holds
//! up only its own streams. An activity on a cluster this orderd is not configured with
//! is skipped, with one warning and the `orderd_unknown_cluster_activities` gauge.
//!
//! An idle consumer sleeps until an `XADD` on its stream wakes it ([`crate::wake`]),
//! or, without wake-ups, polls every `block_ms`; either way nothing is sent for an
//! idle stream but its claim pass, so idle CPU does not grow with the streams.
//!
//! One pass of a stream consumer:
//! 1. every `claim_idle_ms / 2`, `XAUTOCLAIM` entries idle longer than `claim_idle_ms`
//!    (a dead consumer's, or ones that failed here); those delivered more than
//!    `max_deliveries` times go to the dead letters;
//! 2. otherwise `XREADGROUP ... >` up to `batch_size` new entries; fewer than that are
//!    held `linger_ms`, then topped up with what arrived meanwhile (one more read);
//! 3. one MySQL transaction for the batch ([`Db::write_batch`]); while MySQL fails,
//!    back off (exponential, capped) holding the batch and acknowledging nothing;
//! 4. `XACK` + `XDEL` of every entry that is now an order (new, failed or already
//!    there). Poison entries stay pending and come back through step 1.
//!
//! Every command of a consumer goes to its stream's cluster, but for the dead letters'
//! `sk:dlq`, which is on the default cluster.
//!
//! Acknowledged entries are deleted, so a stream's length is its backlog (the lag
//! metric) and streams stay small.
//!
//! (Over 400 lines: discovery, reading, claiming and the retry/dead-letter decision of one
//! stream consumer are one loop over shared state.)

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seckill_daemon::shutdown::Shutdown;
use seckill_lua::keys;
use tokio::task::JoinSet;

use crate::clusters::{Cluster, Clusters, UnknownClusters};
use crate::config::ConsumerConfig;
use crate::db::{Db, Written};
use crate::metrics::Metrics;
use crate::model::Reservation;
use crate::redis::{Entry, Redis};

/// Everything a consumer needs; shared by all of them.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub db: Db,
    /// Every Redis cluster, and where each activity lives.
    pub clusters: Clusters,
    pub cfg: ConsumerConfig,
    pub consumer: String,
    pub pay_timeout: Duration,
    pub metrics: Metrics,
    /// Last error of each failing entry (by entry id), for its dead letter.
    pub errors: Arc<Mutex<HashMap<String, String>>>,
}

/// Exponential back-off with a cap and a little jitter.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            next: base,
        }
    }

    /// The wait before the next try; doubles up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.cap);
        let jitter = rand::random::<u64>() % (d.as_millis() as u64 / 4 + 1);
        d + Duration::from_millis(jitter)
    }

    pub fn reset(&mut self) {
        self.next = self.base;
    }
}

/// Sleeps `d` or until shutdown; false when shutting down.
async fn pause(d: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => !shutdown.is_fired(),
        _ = shutdown.clone().wait() => false,
    }
}

/// Finds streams and runs their consumers until shutdown; returns after every
/// consumer finished its batch in hand.
pub async fn discover(ctx: Ctx, shutdown: Shutdown) {
    // (cluster, stream): an activity moved to another cluster gets a consumer there,
    // and the one on its old cluster drains what is left.
    let mut running: HashSet<(String, String)> = HashSet::new();
    let mut unknown = UnknownClusters::default();
    let mut tasks = JoinSet::new();
    let every = Duration::from_millis(ctx.cfg.discovery_interval_ms);
    loop {
        match ctx.db.published_activities().await {
            Ok(list) => {
                let mut unplaced = HashMap::new();
                for act in list {
                    ctx.clusters.place(act.id, &act.redis_cluster);
                    let Some(cluster) = ctx.clusters.resolve(&act.redis_cluster) else {
                        unplaced.insert(act.id, act.redis_cluster);
                        continue;
                    };
                    for i in 0..act.shards {
                        let stream = keys::orders_stream(act.id, i);
                        if running.insert((cluster.name.clone(), stream.clone())) {
                            let c = StreamConsumer::new(ctx.clone(), cluster.clone(), stream);
                            tasks.spawn(c.run(shutdown.clone()));
                        }
                    }
                }
                for (activity, cluster) in unknown.pass(unplaced) {
                    tracing::warn!(activity, %cluster,
                        "activity placed on a Redis cluster this orderd has no \
                         [redis.clusters.<name>] for; its streams are not consumed");
                }
                ctx.metrics
                    .unknown_cluster_activities
                    .set(unknown.len() as i64);
            }
            Err(e) => tracing::warn!(error = %e, "cannot read published activities"),
        }
        if !pause(every, &shutdown).await {
            break;
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// The consumer of one stream.
#[derive(Debug)]
pub struct StreamConsumer {
    ctx: Ctx,
    /// The cluster the stream lives on; `redis` is its client.
    cluster: String,
    redis: Redis,
    /// The default cluster's client, for `sk:dlq`.
    dlq: Redis,
    wakes: crate::wake::Wakes,
    stream: String,
    backoff: Backoff,
}

impl StreamConsumer {
    /// The consumer of `stream`, which lives on `cluster`.
    pub fn new(ctx: Ctx, cluster: Cluster, stream: String) -> Self {
        let backoff = Backoff::new(
            Duration::from_millis(ctx.cfg.backoff_base_ms),
            Duration::from_millis(ctx.cfg.backoff_cap_ms),
        );
        Self {
            dlq: ctx.clusters.default_cluster().redis.clone(),
            ctx,
            cluster: cluster.name,
            redis: cluster.redis,
            wakes: cluster.wakes,
            stream,
            backoff,
        }
    }

    /// `XGROUP CREATE ... MKSTREAM` until it succeeds (backing off, one warning);
    /// false on shutdown.
    async fn create_group(&mut self, shutdown: &Shutdown) -> bool {
        let mut warned = false;
        loop {
            match self
                .redis
                .ensure_group(&self.stream, &self.ctx.cfg.group)
                .await
            {
                Ok(()) => {
                    self.backoff.reset();
                    tracing::info!(stream = %self.stream, cluster = %self.cluster, "consuming");
                    return true;
                }
                Err(e) => {
                    if !warned {
                        warned = true;
                        tracing::warn!(stream = %self.stream, cluster = %self.cluster, error = %e,
                            "cannot create the consumer group; retrying");
                    }
                    let d = self.backoff.next_delay();
                    if !pause(d, shutdown).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Runs until shutdown; the batch in hand is finished first.
    pub async fn run(mut self, shutdown: Shutdown) {
        let claim_every = Duration::from_millis((self.ctx.cfg.claim_idle_ms / 2).max(10));
        let idle = Duration::from_millis(self.ctx.cfg.block_ms);
        let woken = self.wakes.register(&self.stream);
        if !self.create_group(&shutdown).await {
            return;
        }
        let mut last_claim: Option<Instant> = None;
        // The lag gauge (XLEN) is read while entries flow (at most once a second) and
        // once when the stream falls idle; never for a stream that stays idle.
        let mut last_lag = Instant::now() - Duration::from_secs(10);
        let mut lag_stale = true;
        let lag = self
            .ctx
            .metrics
            .stream_lag
            .with_label_values(&[self.stream.as_str()]);
        // Clean: the group's pending list was empty after an empty read, and no XADD has
        // woken us since. Nothing can then be waiting for a claim (entries enter the
        // pending list only by being read, after an XADD that wakes every orderd's
        // consumer of the stream), so a clean stream skips its claim passes and sleeps
        // until woken: by an XADD, or in turn by the slow sweep (`wake::sweep`).
        let mut clean = false;
        while !shutdown.is_fired() {
            let claim_due = last_claim.is_none_or(|t| t.elapsed() >= claim_every);
            let read = if claim_due {
                last_claim = Some(Instant::now());
                self.redis
                    .autoclaim(
                        &self.stream,
                        &self.ctx.cfg.group,
                        &self.ctx.consumer,
                        self.ctx.cfg.claim_idle_ms,
                        self.ctx.cfg.batch_size,
                    )
                    .await
                    .map(|e| (e, true))
            } else {
                self.redis
                    .read_new(
                        &self.stream,
                        &self.ctx.cfg.group,
                        &self.ctx.consumer,
                        self.ctx.cfg.batch_size,
                    )
                    .await
                    .map(|e| (e, false))
            };
            let (entries, claimed) = match read {
                Ok(r) => r,
                Err(e) if e.is_no_group() => {
                    // Redis lost the group (and likely the stream): stockd rebuilds the
                    // shard and its next XADD makes a stream without our group, whose
                    // entries nobody would read. Create the group again, from the
                    // stream's start, so every reservation since is read.
                    tracing::warn!(stream = %self.stream, cluster = %self.cluster, error = %e,
                        "the consumer group is gone; creating it again");
                    if !self.create_group(&shutdown).await {
                        break;
                    }
                    clean = false;
                    last_claim = None;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(stream = %self.stream, cluster = %self.cluster, error = %e,
                        "stream read failed");
                    let d = self.backoff.next_delay();
                    if !pause(d, &shutdown).await {
                        break;
                    }
                    continue;
                }
            };
            if entries.is_empty() {
                if claimed {
                    continue; // now read the new entries
                }
                if lag_stale {
                    if let Ok(n) = self.redis.stream_len(&self.stream).await {
                        lag.set(n as i64);
                        lag_stale = false;
                    }
                }
                let woken_only = self.ctx.cfg.keyspace_events && self.wakes.listening();
                if woken_only && !clean {
                    clean = matches!(
                        self.redis
                            .pending_count(&self.stream, &self.ctx.cfg.group)
                            .await,
                        Ok(0)
                    );
                }
                let since = last_claim.map_or(claim_every, |t| t.elapsed());
                let wait = match (woken_only, clean) {
                    // Until an XADD (or the sweep) wakes us or the claim pass is due.
                    (true, false) => Some(claim_every.saturating_sub(since)),
                    // Until an XADD or the sweep wakes us.
                    (true, true) => None,
                    (false, _) => Some(idle),
                };
                let timer = async {
                    match wait {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = woken.notified() => {}
                    _ = timer => {}
                    _ = shutdown.clone().wait() => break,
                }
                // Woken: the next pass is a full one (claim when due, read, check).
                clean = false;
                continue;
            }
            clean = false;
            lag_stale = true;
            if last_lag.elapsed() >= Duration::from_secs(1) {
                last_lag = Instant::now();
                if let Ok(n) = self.redis.stream_len(&self.stream).await {
                    lag.set(n as i64);
                }
            }
            let entries = if claimed {
                entries
            } else {
                self.linger(entries, &shutdown).await
            };
            self.process(entries, claimed, &shutdown).await;
        }
        tracing::debug!(stream = %self.stream, "consumer stopped");
    }

    /// Holds a batch of new entries smaller than `batch_size` for `consumer.linger_ms`,
    /// then adds the entries that arrived meanwhile (one read, up to `batch_size`), so
    /// that a burst of reservations becomes one MySQL transaction per stream rather than
    /// one per `XADD`. A read that comes back full is not held, so a flow faster than
    /// `batch_size` per linger is written at full speed (each write's backlog fills the
    /// next read). Why: at a sale's opening stockd appends a few entries at a time to
    /// every stream; each written at once is a transaction on the item's hot stock row,
    /// and MySQL's and orderd's CPU then competes with the edge and stockd in the very
    /// second they answer the crowd (issue 15: with the intake paused over the opening,
    /// the burst's `reserved` p99 fell from 140-210 ms to 25 ms on the 2-core stack).
    /// The entries are pending meanwhile (delivered to this consumer, not acknowledged):
    /// a crash loses nothing, they are claimed after `claim_idle_ms`, which the config
    /// keeps at least four lingers long. Shutdown ends the wait; a failed top-up read
    /// keeps what is in hand (the rest is read next pass).
    async fn linger(&mut self, mut entries: Vec<Entry>, shutdown: &Shutdown) -> Vec<Entry> {
        let (linger, max) = (self.ctx.cfg.linger_ms, self.ctx.cfg.batch_size);
        if linger == 0 || entries.len() as u64 >= max {
            return entries;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(linger)) => {}
            _ = shutdown.clone().wait() => return entries,
        }
        let room = max - entries.len() as u64;
        match self
            .redis
            .read_new(&self.stream, &self.ctx.cfg.group, &self.ctx.consumer, room)
            .await
        {
            Ok(more) => entries.extend(more),
            Err(e) => {
                tracing::debug!(stream = %self.stream, error = %e,
                    "top-up read failed; writing the batch in hand");
            }
        }
        entries
    }

    /// Writes one batch and acknowledges it; retries (backing off) while MySQL or
    /// Redis fail, until done or shutdown.
    async fn process(&mut self, entries: Vec<Entry>, claimed: bool, shutdown: &Shutdown) {
        let started = Instant::now();
        let entries = if claimed {
            match self.dead_letter_overdue(entries).await {
                Some(rest) => rest,
                None => return, // Redis or MySQL failed; the entries stay pending
            }
        } else {
            entries
        };
        let mut parsed = Vec::with_capacity(entries.len());
        let mut ids = Vec::with_capacity(entries.len());
        let mut poison = Vec::new();
        for e in &entries {
            match Reservation::from_fields(&e.fields) {
                Ok(r) => {
                    parsed.push(r);
                    ids.push(e.id.clone());
                }
                Err(why) => poison.push((e.id.clone(), why)),
            }
        }
        let written = loop {
            match self.ctx.db.write_batch(&parsed, self.ctx.pay_timeout).await {
                Ok(w) => {
                    self.backoff.reset();
                    break w;
                }
                Err(e) => {
                    self.ctx.metrics.batch_failures.inc();
                    let d = self.backoff.next_delay();
                    tracing::warn!(stream = %self.stream, error = %e, retry_ms = d.as_millis() as u64,
                        "batch failed; backing off, nothing acknowledged");
                    if !pause(d, shutdown).await {
                        return;
                    }
                }
            }
        };
        let mut ack = Vec::with_capacity(ids.len());
        for ((id, w), r) in ids.into_iter().zip(written).zip(&parsed) {
            // One line per order written, with the buyer's trace id: the third log of
            // one purchase (docs/orderd.md, "Following one buyer").
            if matches!(w, Written::Pending | Written::Failed(_)) {
                tracing::info!(order = %r.rid, user = %r.user,
                    trace_id = r.trace_id.as_deref().unwrap_or(""),
                    status = if matches!(w, Written::Pending) { "PENDING" } else { "FAILED" },
                    "order written");
            }
            match w {
                Written::Pending => {
                    self.ctx
                        .metrics
                        .orders_written
                        .with_label_values(&["PENDING"])
                        .inc();
                    ack.push(id);
                }
                Written::Failed(_) => {
                    self.ctx
                        .metrics
                        .orders_written
                        .with_label_values(&["FAILED"])
                        .inc();
                    ack.push(id);
                }
                Written::Already => ack.push(id),
                Written::Poison(why) => poison.push((id, why)),
            }
        }
        if !poison.is_empty() {
            let mut errors = self.ctx.errors.lock().expect("errors lock");
            for (id, why) in poison {
                tracing::warn!(stream = %self.stream, entry = %id, error = %why, "entry cannot become an order yet");
                errors.insert(id, why);
            }
        }
        loop {
            match self
                .redis
                .ack_and_delete(&self.stream, &self.ctx.cfg.group, &ack)
                .await
            {
                Ok(()) => break,
                Err(e) => {
                    // Written but not acknowledged: a redelivery finds the orders
                    // already there, so giving up here is safe.
                    let d = self.backoff.next_delay();
                    tracing::warn!(stream = %self.stream, error = %e, "ack failed; retrying");
                    if !pause(d, shutdown).await {
                        return;
                    }
                }
            }
        }
        if !ack.is_empty() {
            let mut errors = self.ctx.errors.lock().expect("errors lock");
            for id in &ack {
                errors.remove(id);
            }
        }
        self.ctx.metrics.batch_size.observe(entries.len() as f64);
        self.ctx
            .metrics
            .batch_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// Moves claimed entries delivered more than `max_deliveries` times to the dead
    /// letters (table, then `sk:dlq`, then ack); returns the rest. None when Redis or
    /// MySQL failed (nothing acknowledged).
    async fn dead_letter_overdue(&mut self, entries: Vec<Entry>) -> Option<Vec<Entry>> {
        let min = entries
            .iter()
            .map(|e| e.id.as_str())
            .min_by(|a, b| cmp_ids(a, b))?;
        let max = entries
            .iter()
            .map(|e| e.id.as_str())
            .max_by(|a, b| cmp_ids(a, b))?;
        let counts = match self
            .redis
            .deliveries(
                &self.stream,
                &self.ctx.cfg.group,
                &self.ctx.consumer,
                min,
                max,
                entries.len() as u64 * 2 + 10,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(stream = %self.stream, error = %e, "XPENDING failed");
                return None;
            }
        };
        let (overdue, rest): (Vec<Entry>, Vec<Entry>) = entries
            .into_iter()
            .partition(|e| counts.get(&e.id).copied().unwrap_or(0) > self.ctx.cfg.max_deliveries);
        for e in overdue {
            let deliveries = counts.get(&e.id).copied().unwrap_or(0);
            let last_error = self
                .ctx
                .errors
                .lock()
                .expect("errors lock")
                .get(&e.id)
                .cloned()
                .unwrap_or_else(|| {
                    "delivered repeatedly without being acknowledged (consumer died or failed)"
                        .into()
                });
            let rid = e.fields.get("rid").cloned();
            let payload = serde_json::to_string(&e.fields).unwrap_or_else(|_| "{}".into());
            let saved = self
                .ctx
                .db
                .insert_dead_letter(
                    &self.stream,
                    &e.id,
                    rid.as_deref(),
                    &payload,
                    deliveries,
                    &last_error,
                )
                .await;
            if let Err(err) = saved {
                tracing::warn!(stream = %self.stream, error = %err, "cannot record dead letter");
                return None;
            }
            // `sk:dlq` is on the default cluster; while that one is down the entry stays
            // pending and is tried again at the next claim pass.
            if let Err(err) = self
                .dlq
                .push_dead_letter(
                    &self.stream,
                    &e.id,
                    rid.as_deref().unwrap_or(""),
                    &last_error,
                    deliveries,
                )
                .await
            {
                tracing::warn!(stream = %self.stream, error = %err, "cannot append to sk:dlq");
                return None;
            }
            if let Err(err) = self
                .redis
                .ack_and_delete(
                    &self.stream,
                    &self.ctx.cfg.group,
                    std::slice::from_ref(&e.id),
                )
                .await
            {
                tracing::warn!(stream = %self.stream, error = %err, "cannot ack dead letter");
                return None;
            }
            tracing::error!(stream = %self.stream, entry = %e.id, deliveries, error = %last_error,
                "entry dead-lettered");
            self.ctx.metrics.dead_letters_total.inc();
            self.ctx.metrics.dead_letters.inc();
            self.ctx.errors.lock().expect("errors lock").remove(&e.id);
        }
        Some(rest)
    }
}

/// Orders stream ids `<ms>-<seq>` numerically.
fn cmp_ids(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |s: &str| -> (u64, u64) {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    split(a).cmp(&split(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_compare_numerically() {
        assert_eq!(cmp_ids("9-1", "10-0"), std::cmp::Ordering::Less);
        assert_eq!(cmp_ids("10-2", "10-10"), std::cmp::Ordering::Less);
        assert_eq!(cmp_ids("10-2", "10-2"), std::cmp::Ordering::Equal);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let waits: Vec<u64> = (0..6).map(|_| b.next_delay().as_millis() as u64).collect();
        for (w, base) in waits.iter().zip([100, 200, 400, 800, 1000, 1000]) {
            assert!((base..=base + base / 4).contains(w), "{waits:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
