//! AdminService logic: create, get and list activities, publish (warm-up) now or on
//! schedule, item status, reconciliation, and the shared edge ban list.
//!
//! Publish = warm-up: per shard, `WARM` (no force) with the split of each item's
//! MySQL stock under a fresh fence epoch, then the meta hash, `SADD sk:activities`,
//! `PUBLISH sk:activities`, and MySQL status PUBLISHED. `WARM` without force never
//! touches a shard that already has its fence, so publishing twice never adds
//! stock; an already published activity whose shards lost their state is recomputed
//! instead of warmed from scratch.
//!
//! (Over 400 lines: AdminService's operations (create, publish and warm, status, reconcile,
//! bans) share the app state and MySQL snapshot helpers; a file each would split one API.)

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill_lua::calls::{WarmCall, Warmed};
use seckill_lua::clock::now_ms;
use seckill_lua::ids::epoch_from_millis;
use seckill_lua::messages::BanChange;
use seckill_lua::{keys, split_stock};
use seckill_proto::pb;

use crate::app::App;
use crate::catalog::ActivityEntry;
use crate::db;
use crate::domain::NewActivity;
use crate::error::{invalid, Error, Result};

/// What a publish of a not yet published activity does ([`App::warm_claim`]).
enum Warm {
    /// Warm from a snapshot: this call made the first claim, and sends no `WARM` after
    /// the deadline.
    Snapshot(Instant),
    /// Another call published it: as for a published activity.
    AsPublished,
    /// This call took a claim that had run out of time over: as for a published
    /// activity, which it is about to be.
    TakenOver,
    /// Another call's claim is running, and this call does not wait.
    Busy,
}

impl App {
    pub async fn create_activity(&self, req: &pb::CreateActivityRequest) -> Result<pb::Activity> {
        let new = NewActivity::parse(req)?;
        if !self.clusters.knows(&new.redis_cluster) {
            let known: Vec<&str> = self.clusters.all().map(|(name, _)| name).collect();
            return Err(invalid(
                "redis_cluster",
                format!(
                    "`{}` is not a Redis Cluster of this stockd (configured: {}; add \
                     [redis.clusters.{}] to every daemon's config first)",
                    new.redis_cluster,
                    known.join(", "),
                    new.redis_cluster
                ),
            ));
        }
        let id = db::create_activity(&self.db, &new).await?;
        tracing::info!(activity = id, title = %new.title, "activity created");
        self.get_activity(id).await
    }

    pub async fn get_activity(&self, id: u64) -> Result<pb::Activity> {
        db::get_activity(&self.db, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("activity {id} not found")))
    }

    pub async fn list_activities(&self, current_only: bool) -> Result<Vec<pb::Activity>> {
        db::list_activities(&self.db, current_only, None, now_ms()).await
    }

    /// Publishes now (`publish_at_ms` 0 or past) or schedules. Returns the activity
    /// and whether this call warmed Redis. A publish that finds another call warming
    /// the activity waits for it (see [`Self::warm_claim`]).
    pub async fn publish(
        self: &Arc<Self>,
        id: u64,
        publish_at_ms: i64,
    ) -> Result<(pb::Activity, bool)> {
        let published = self.publish_with(id, publish_at_ms, true).await?;
        // `None` only when it does not wait.
        published.ok_or_else(|| Error::Unavailable(format!("activity {id} is being published")))
    }

    /// [`Self::publish`]; with `wait` false, `None` when another call is warming the
    /// activity (the scheduled publish: every stockd of a fleet runs it, and the refresh
    /// loop must not stall behind another's warm-up).
    async fn publish_with(
        self: &Arc<Self>,
        id: u64,
        publish_at_ms: i64,
        wait: bool,
    ) -> Result<Option<(pb::Activity, bool)>> {
        if publish_at_ms < 0 {
            return Err(invalid("publish_at_ms", "must not be negative"));
        }
        let activity = self.get_activity(id).await?;
        let now = now_ms();
        if activity.end_at_ms <= now {
            return Err(Error::FailedPrecondition(format!(
                "activity {id} ended at {} (unix ms); an ended window cannot be published",
                activity.end_at_ms
            )));
        }
        let published = activity.status == pb::ActivityStatus::Published as i32;
        if publish_at_ms > now && !published {
            if publish_at_ms >= activity.end_at_ms {
                return Err(invalid("publish_at_ms", "must be before the window ends"));
            }
            db::set_scheduled(&self.db, id, publish_at_ms).await?;
            tracing::info!(activity = id, publish_at_ms, "publish scheduled");
            return Ok(Some((self.get_activity(id).await?, false)));
        }
        // The test suite holds a publish here, after its read of the activity
        // (`stockd_late_warm`).
        fail::fail_point!("stockd::publish::before_warm");
        let Some(warmed) = self.warm(&activity, published, wait).await? else {
            return Ok(None);
        };
        db::set_published(&self.db, id, now).await?;
        fail::fail_point!("stockd::publish::before_catalog");
        let activity = self.get_activity(id).await?;
        let (entry, added) = self.catalog.insert(activity.clone(), true);
        if !added && !entry.is_available() {
            // The refresh loop read the activity published in MySQL before this call
            // put it in the catalog, and added it closed, to open after a fence check:
            // that check now, not up to `stock.fence_check_ms` later (meanwhile the
            // stockd that published the sale answered its buyers UNAVAILABLE). It opens
            // the entry only if every shard's fence is there and nothing is behind.
            self.check_activity(&entry).await;
        }
        self.redis().sadd(keys::ACTIVITIES, id.to_string()).await?;
        self.redis()
            .publish(keys::ACTIVITIES_CHANNEL, id.to_string())
            .await?;
        tracing::info!(activity = id, warmed, "published");
        Ok(Some((activity, warmed)))
    }

    /// Warms Redis for a publish: `Some(wrote)`, or `None` when another call is warming
    /// the activity and `wait` is false.
    async fn warm(
        self: &Arc<Self>,
        activity: &pb::Activity,
        published: bool,
        wait: bool,
    ) -> Result<Option<bool>> {
        let a = activity.id;
        let claim = if published {
            Warm::AsPublished
        } else {
            self.warm_claim(activity, wait).await?
        };
        let deadline = match claim {
            Warm::Busy => return Ok(None),
            Warm::AsPublished => return self.warm_as_published(a).await.map(Some),
            Warm::TakenOver => return self.take_over(a).await.map(Some),
            Warm::Snapshot(deadline) => deadline,
        };
        match self.warm_from_snapshot(activity, deadline).await {
            Ok(Some(wrote)) => Ok(Some(wrote)),
            // Past the deadline a takeover may be rebuilding it: so does this call.
            Ok(None) => self.take_over(a).await.map(Some),
            Err(e) => {
                // Nothing sells before the activity is PUBLISHED: a publish retried after
                // one more Redis timeout takes over (and rebuilds, counting what this one
                // wrote).
                let gap = Duration::from_millis(self.config.redis.timeout_ms);
                if let Err(e) = db::abandon_warm(&self.db, a, gap).await {
                    tracing::warn!(activity = a, error = %e, "cannot give the failed warm-up's claim back");
                }
                Err(e)
            }
        }
    }

    /// A warm-up taken over (its claimant died, or ran out of time): the activity is
    /// published first, and then warmed as a published one. Published with a fence
    /// missing, it opens nowhere before a rebuild (a fence check or this call's); with
    /// every fence there (the claimant died after its last `WARM`), it is as warm as it
    /// would have been.
    async fn take_over(self: &Arc<Self>, a: u64) -> Result<bool> {
        db::set_published(&self.db, a, now_ms()).await?;
        self.warm_as_published(a).await
    }

    /// The warm-up of a published activity: meta when every fence is there, else a
    /// rebuild from MySQL, which counts what MySQL and the shards hold.
    async fn warm_as_published(self: &Arc<Self>, a: u64) -> Result<bool> {
        // Read again: the status and version the publish that warmed it set.
        let activity = self.get_activity(a).await?;
        if self.fences_present(a, activity.shard_count.max(1)).await? {
            self.write_meta(&activity).await?;
            return Ok(false);
        }
        let (entry, _) = self.catalog.insert(activity, false);
        self.recompute_now(&entry).await?;
        Ok(true)
    }

    /// The first warm-up of `activity`, from a snapshot of MySQL: `Some(wrote)`, or
    /// `None` when `deadline` came before every shard was sent its `WARM` (a takeover may
    /// have begun; see [`Self::warm_claim`]).
    async fn warm_from_snapshot(
        &self,
        activity: &pb::Activity,
        deadline: Instant,
    ) -> Result<Option<bool>> {
        let a = activity.id;
        let shards = activity.shard_count.max(1);
        // Units not yet taken by an order (equal to the total before the sale).
        let (records, _) = db::snapshot(&self.db, a, &[]).await?;
        let epoch = epoch_from_millis(now_ms().max(0) as u64);
        let call_time = Duration::from_millis(self.config.redis.timeout_ms);
        let mut wrote = false;
        for i in 0..shards {
            if Instant::now() + call_time >= deadline {
                tracing::warn!(
                    activity = a,
                    shard = i,
                    "the warm-up ran out of its claim's time; rebuilding from MySQL instead"
                );
                return Ok(None);
            }
            let mut warm = WarmCall::new(a, i, &epoch, false);
            for rec in &records {
                warm.push(
                    rec.item_id,
                    split_stock(u64::from(rec.stock), shards)[i as usize],
                );
            }
            let r = self
                .redis_named(&activity.redis_cluster)?
                .call(warm)
                .await?;
            wrote |= r.as_i64().map(Warmed::from_reply) == Some(Warmed::Wrote);
        }
        self.write_meta(activity).await?;
        Ok(Some(wrote))
    }

    /// Who warms the not yet published `activity` (`db::claim_warm`). Every stockd of a
    /// fleet runs a scheduled publish, so several publishes of one activity run at once;
    /// a second warm-up from a snapshot could land on a shard after the sale began there
    /// and its node came back empty (fence and lease gone, no rebuild yet), and put the
    /// units it sold on sale again. So only the call that makes the first claim warms
    /// from a snapshot, and it sends no `WARM` past [`Self::warm_takeover`] from just
    /// before its claim, less a margin. The claim holds the claimant's own time in MySQL
    /// (`warm_claim_until`), so a peer with other timeouts cannot cut it short. The
    /// others wait until the activity is PUBLISHED (or, `wait` false, give up at once),
    /// then go the way of a published activity; one that finds the claim run out by
    /// MySQL's clock (the claimant died, or ran out of time) claims it anew, publishes
    /// and rebuilds from MySQL (the rebuild counts whatever the claimant wrote; nothing
    /// sold before PUBLISHED).
    async fn warm_claim(&self, activity: &pb::Activity, wait: bool) -> Result<Warm> {
        let a = activity.id;
        let takeover = self.warm_takeover(activity);
        // A margin of one Redis timeout and a second: the last `WARM` is answered (or
        // given up on) well before a taker may act.
        let margin = Duration::from_millis(self.config.redis.timeout_ms + 1000);
        let deadline = Instant::now() + takeover.saturating_sub(margin);
        if db::claim_warm(&self.db, a, takeover).await? {
            // The test suite holds a claimant here (`stockd_late_warm`).
            fail::fail_point!("stockd::publish::claimed");
            return Ok(Warm::Snapshot(deadline));
        }
        loop {
            if self.get_activity(a).await?.status == pb::ActivityStatus::Published as i32 {
                return Ok(Warm::AsPublished);
            }
            if db::take_over_warm(&self.db, a, takeover).await? {
                tracing::warn!(
                    activity = a,
                    "another publish claimed the warm-up and has not published the activity; rebuilding from MySQL instead"
                );
                return Ok(Warm::TakenOver);
            }
            if !wait {
                return Ok(Warm::Busy);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How long the claimant of a warm-up has: its MySQL snapshot (twice
    /// `mysql.acquire_timeout_ms`), its Redis calls (one per shard and the meta, at
    /// `redis.timeout_ms` each), and 2 s.
    fn warm_takeover(&self, activity: &pb::Activity) -> Duration {
        let calls = u64::from(activity.shard_count.max(1)) + 2;
        Duration::from_millis(
            calls * self.config.redis.timeout_ms + 2 * self.config.mysql.acquire_timeout_ms + 2000,
        )
    }

    /// Writes `sk:{a}:meta` and adds the activity to `sk:activities`.
    pub(crate) async fn write_meta(&self, activity: &pb::Activity) -> Result<()> {
        use keys::meta as f;
        let a = activity.id;
        let mut m: HashMap<String, String> = HashMap::new();
        m.insert(f::TITLE.into(), activity.title.clone());
        m.insert(f::START_MS.into(), activity.start_at_ms.to_string());
        m.insert(f::END_MS.into(), activity.end_at_ms.to_string());
        m.insert(f::SHARDS.into(), activity.shard_count.to_string());
        m.insert(
            f::PER_USER_LIMIT.into(),
            activity.per_user_limit.max(1).to_string(),
        );
        m.insert(f::VERSION.into(), activity.version.to_string());
        m.insert(
            f::CHALLENGE_BITS.into(),
            activity.challenge_bits.to_string(),
        );
        m.insert(f::CLUSTER.into(), activity.redis_cluster.clone());
        let ids: Vec<String> = activity.items.iter().map(|i| i.id.to_string()).collect();
        m.insert(f::ITEMS.into(), ids.join(","));
        for it in &activity.items {
            m.insert(format!("{}{}", f::ITEM_STOCK, it.id), it.stock.to_string());
            m.insert(format!("{}{}", f::ITEM_TITLE, it.id), it.title.clone());
            m.insert(
                format!("{}{}", f::ITEM_PRICE, it.id),
                it.sale_price_cents.to_string(),
            );
            m.insert(
                format!("{}{}", f::ITEM_LIST_PRICE, it.id),
                it.price_cents.to_string(),
            );
        }
        self.redis().hset(keys::meta(a), m).await?;
        self.redis().sadd(keys::ACTIVITIES, a.to_string()).await
    }

    /// Loads published activities into the catalog and publishes scheduled ones whose
    /// time has come. The activities are read only when the [`db::PublishedMark`]
    /// moved since `last` (a publication here or by a peer, a change to a published
    /// activity): an idle poll is two one-row queries whatever the number of
    /// activities. The mark is read before the activities, so a publication between
    /// the two reads is loaded now or at the next poll, never missed.
    pub async fn refresh(self: &Arc<Self>, last: &mut Option<db::PublishedMark>) -> Result<()> {
        let now = now_ms();
        let mark = db::published_mark(&self.db).await?;
        if last.as_ref() != Some(&mark) {
            for a in db::published_activities(&self.db).await? {
                if !self.clusters.knows(&a.redis_cluster) {
                    // Made by a peer configured with a cluster this process lacks: left
                    // out (its buyers get UNAVAILABLE here and are served by that peer),
                    // so it cannot hold this process's readiness back.
                    if self
                        .unplaced
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(a.id)
                    {
                        tracing::error!(
                            activity = a.id,
                            redis_cluster = %a.redis_cluster,
                            "activity on a Redis Cluster this stockd is not configured with \
                             (add [redis.clusters.{}]); not served here",
                            a.redis_cluster
                        );
                    }
                    continue;
                }
                // New to this process: it opens after the fence check.
                self.catalog.insert(a, false);
            }
            *last = Some(mark);
        }
        if !self.catalog.is_loaded() {
            self.catalog.set_loaded();
            if self.config.stock.recompute_at_start {
                self.check_at_start().await;
            } else {
                self.catalog.set_opening();
                self.check_fences().await;
            }
        }
        for id in db::due_scheduled(&self.db, now).await? {
            match self.publish_with(id, 0, false).await {
                Ok(Some(_)) => tracing::info!(activity = id, "scheduled publish done"),
                Ok(None) => tracing::debug!(activity = id, "another stockd is warming it"),
                Err(e) => tracing::warn!(activity = id, error = %e, "scheduled publish failed"),
            }
        }
        Ok(())
    }

    /// [`Self::refresh`] every `stock.schedule_poll_ms` until shutdown.
    pub async fn refresh_loop(self: Arc<Self>) {
        let period = Duration::from_millis(self.config.stock.schedule_poll_ms);
        let mut last = None;
        loop {
            if let Err(e) = self.refresh(&mut last).await {
                tracing::warn!(error = %e, "activity refresh failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.shutdown.clone().wait() => return,
            }
        }
    }

    /// The published activity, from the catalog or MySQL.
    async fn entry(&self, id: u64) -> Result<Arc<ActivityEntry>> {
        if let Some(e) = self.catalog.get(id) {
            return Ok(e);
        }
        let a = self.get_activity(id).await?;
        if a.status != pb::ActivityStatus::Published as i32 {
            return Err(Error::FailedPrecondition(format!(
                "activity {id} is not published"
            )));
        }
        Ok(self.catalog.insert(a, false).0)
    }

    /// Redis' view of one item.
    pub async fn item_status(&self, entry: &ActivityEntry, item: u64) -> Result<pb::ItemStatus> {
        let a = entry.id();
        let shards = entry.shards();
        let Some(it) = entry.items.get(&item) else {
            return Err(Error::NotFound(format!(
                "item {item} not found in activity {a}"
            )));
        };
        let shard_remaining = self.shard_stock(a, item, shards).await?;
        let redis = self.redis_of(entry)?;
        let held = futures::future::try_join_all(
            (0..shards).map(|i| redis.held_units(keys::buyers(a, i, item))),
        )
        .await?;
        let sold_out = redis.exists(keys::sold_out(a, item)).await?;
        Ok(pb::ItemStatus {
            item_id: item,
            total: it.total,
            remaining: shard_remaining.iter().sum(),
            shard_remaining,
            reserved: held.iter().sum(),
            sold_out,
            available: entry.is_available() && self.fences_present(a, shards).await?,
            gave_up: it.gave_up.load(Ordering::Relaxed),
        })
    }

    pub async fn activity_status(&self, id: u64) -> Result<pb::ActivityStatusResponse> {
        let entry = self.entry(id).await?;
        let mut items = Vec::new();
        for s in entry.item_ids() {
            items.push(self.item_status(&entry, s).await?);
        }
        Ok(pb::ActivityStatusResponse {
            activity: Some(entry.activity.clone()),
            items,
        })
    }

    pub async fn get_stock(&self, a: u64, s: u64) -> Result<pb::GetStockResponse> {
        let entry = self.entry(a).await?;
        let st = self.item_status(&entry, s).await?;
        Ok(pb::GetStockResponse {
            activity_id: a,
            item_id: s,
            total: st.total,
            remaining: st.remaining,
            shard_remaining: st.shard_remaining,
            reserved: st.reserved,
            sold_out: st.sold_out,
            available: st.available,
        })
    }

    /// Per item, in units: total = Redis remaining + in flight + active orders, where
    /// in flight = units held by buyer records in Redis − units of active orders. `repair` rebuilds Redis from MySQL
    /// (the recompute) when nothing is in flight.
    pub async fn reconcile(
        self: &Arc<Self>,
        a: u64,
        item: u64,
        repair: bool,
    ) -> Result<Vec<pb::ItemReconciliation>> {
        let entry = self.entry(a).await?;
        let items: Vec<u64> = if item == 0 {
            entry.item_ids()
        } else if entry.items.contains_key(&item) {
            vec![item]
        } else {
            return Err(Error::NotFound(format!(
                "item {item} not found in activity {a}"
            )));
        };
        let mut out = Vec::new();
        for s in &items {
            out.push(self.reconcile_item(&entry, *s).await?);
        }
        if repair {
            let quiet = out.iter().all(|r| r.in_flight == 0);
            if !quiet {
                for r in &mut out {
                    r.message = "not repaired: reservations are in flight; retry when orderd \
                                 has caught up"
                        .into();
                }
            } else {
                self.recompute_now(&entry).await?;
                let mut again = Vec::new();
                for s in &items {
                    let mut r = self.reconcile_item(&entry, *s).await?;
                    r.repaired = true;
                    r.message = "rebuilt from MySQL".into();
                    again.push(r);
                }
                out = again;
            }
        }
        Ok(out)
    }

    async fn reconcile_item(
        &self,
        entry: &ActivityEntry,
        s: u64,
    ) -> Result<pb::ItemReconciliation> {
        let st = self.item_status(entry, s).await?;
        let (mysql_stock, active) = db::item_counts(&self.db, s)
            .await?
            .ok_or_else(|| Error::NotFound(format!("item {s} not found")))?;
        let in_flight = st.reserved - active;
        let difference = i64::from(st.total) - (st.remaining + in_flight + active);
        Ok(pb::ItemReconciliation {
            item_id: s,
            total: st.total,
            redis_remaining: st.remaining,
            in_flight,
            active_orders: active,
            mysql_stock,
            difference,
            consistent: difference == 0 && in_flight >= 0,
            repaired: false,
            message: match difference {
                0 => "consistent".into(),
                d if d > 0 => format!("undersold: {d} units lost from Redis"),
                d => format!("oversold: {} units too many in Redis", -d),
            },
        })
    }

    pub async fn ban(&self, cidr: &str, ttl_secs: u64, reason: &str) -> Result<String> {
        let cidr = normalize_cidr(cidr)?;
        if reason.len() > 200 || reason.chars().any(char::is_control) {
            return Err(invalid("reason", "must be at most 200 printable bytes"));
        }
        if ttl_secs > 10 * 365 * 86_400 {
            return Err(invalid("ttl_secs", "must be at most ten years"));
        }
        let expires_at_ms = if ttl_secs == 0 {
            0
        } else {
            now_ms() as u64 + ttl_secs * 1000
        };
        let mut m = HashMap::new();
        m.insert(cidr.clone(), BanChange::stored_value(expires_at_ms, reason));
        self.redis().hset(keys::BANS.to_string(), m).await?;
        self.redis()
            .publish(
                keys::BANS_CHANNEL,
                BanChange::Ban {
                    cidr: cidr.clone(),
                    expires_at_ms,
                    reason: reason.to_string(),
                }
                .encode(),
            )
            .await?;
        tracing::info!(%cidr, ttl_secs, "banned");
        Ok(cidr)
    }

    pub async fn unban(&self, cidr: &str) -> Result<bool> {
        let cidr = normalize_cidr(cidr)?;
        let removed = self.redis().hdel(keys::BANS, &cidr).await?;
        self.redis()
            .publish(
                keys::BANS_CHANNEL,
                BanChange::Unban { cidr: cidr.clone() }.encode(),
            )
            .await?;
        Ok(removed)
    }

    pub async fn list_bans(&self) -> Result<Vec<pb::Ban>> {
        let now = now_ms();
        let mut bans: Vec<pb::Ban> = self
            .redis()
            .hgetall(keys::BANS)
            .await?
            .into_iter()
            .filter_map(|(cidr, v)| {
                let (exp, reason) = v.split_once('|').unwrap_or((v.as_str(), ""));
                let expires_at_ms: i64 = exp.parse().ok()?;
                (expires_at_ms == 0 || expires_at_ms > now).then(|| pb::Ban {
                    cidr,
                    expires_at_ms,
                    reason: reason.to_string(),
                })
            })
            .collect();
        bans.sort_by(|a, b| a.cidr.cmp(&b.cidr));
        Ok(bans)
    }
}

/// An IP address or CIDR in canonical text (`10.0.0.0/8`, `1.2.3.4`, `::1`).
pub fn normalize_cidr(s: &str) -> Result<String> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok(ip.to_string());
    }
    match s.parse::<ipnet::IpNet>() {
        Ok(net) => Ok(net.trunc().to_string()),
        Err(_) => Err(invalid(
            "cidr",
            format!("`{s}` is not an IP address or CIDR"),
        )),
    }
}
