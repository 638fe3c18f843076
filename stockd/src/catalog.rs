//! The in-memory view of published activities: windows, shard counts and items, so
//! Reserve answers NOT_FOUND / NOT_STARTED / ENDED without a Redis call, and the
//! per-activity availability flag that keeps Reserve at UNAVAILABLE while the
//! activity's shards are being recomputed. Refreshed from MySQL by a background loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use seckill_proto::pb;

use crate::gate::Gate;
use crate::mover::{Landing, Mover};
use crate::shard::{Gap, HighWater, ShardQueue, ShardState};

/// One item of a published activity.
#[derive(Debug)]
pub struct ItemEntry {
    pub id: u64,
    /// Units put on sale.
    pub total: u32,
    /// Reserve calls of this process that ran out of rebalancing attempts while the
    /// shards still held the quantity asked for (answered ABORTED: retry).
    pub gave_up: AtomicU64,
    /// This process's rebalancing moves of the item between their take and their give
    /// ([`crate::mover::Landing`]).
    pub landing: Arc<Landing>,
}

/// One published activity.
#[derive(Debug)]
pub struct ActivityEntry {
    pub activity: pb::Activity,
    pub items: HashMap<u64, ItemEntry>,
    /// Open (Reserve sells), claimed (a rebuild, the start-up check or an open holds
    /// it; at most one per activity and process), and the rebuild asked of the holder.
    /// Closed until the start-up check or the fence check opened it (the fence check
    /// only once [`Catalog::may_open`]), and while rebuilding.
    pub gate: Gate,
    /// When the last rebuild a failed move asked for started, and whether one waits
    /// (`stock.move_repair_gap_ms`).
    pub move_repair: Mutex<crate::recompute::MoveRepair>,
    /// Rotating start of the donor scan, so rebalancing spreads over shards.
    pub rotation: AtomicU32,
    /// Per shard: the high-water mark and the reservation queue.
    shard_state: Vec<ShardState>,
    /// Per (item, home shard) that has emptied: the rebalancing rounds to it. Made on
    /// first need, so a catalog of many live activities holds none for the shards
    /// that never run dry.
    movers: Mutex<HashMap<(u64, u32), Arc<Mover>>>,
}

impl ActivityEntry {
    pub fn new(activity: pb::Activity, available: bool) -> Self {
        let items = activity
            .items
            .iter()
            .map(|i| {
                (
                    i.id,
                    ItemEntry {
                        id: i.id,
                        total: i.stock,
                        gave_up: AtomicU64::new(0),
                        landing: Arc::default(),
                    },
                )
            })
            .collect();
        Self {
            items,
            gate: Gate::new(available),
            move_repair: Mutex::default(),
            rotation: AtomicU32::new(0),
            shard_state: (0..activity_shards(&activity))
                .map(|_| ShardState::default())
                .collect(),
            movers: Mutex::default(),
            activity,
        }
    }

    pub fn id(&self) -> u64 {
        self.activity.id
    }
    pub fn shards(&self) -> u32 {
        activity_shards(&self.activity)
    }
    /// Shard `shard`'s state, `None` past the activity's shard count.
    fn shard(&self, shard: u32) -> Option<&ShardState> {
        self.shard_state.get(shard as usize)
    }
    /// The rebalancing rounds of `item` to home shard `home`.
    pub fn mover(&self, item: u64, home: u32) -> Arc<Mover> {
        let mut movers = self.movers.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(movers.entry((item, home)).or_default())
    }
    /// Per shard, the units `item`'s rounds to that shard keep at `now` and until when
    /// ([`Mover::kept`]); one lock, and no mover made for a shard that never emptied.
    pub fn kept(
        &self,
        item: u64,
        now: std::time::Instant,
    ) -> Vec<Option<(i64, std::time::Instant)>> {
        let movers = self.movers.lock().unwrap_or_else(|p| p.into_inner());
        (0..self.shards())
            .map(|d| movers.get(&(item, d)).and_then(|m| m.kept(now)))
            .collect()
    }
    /// Shard `shard`'s reservation queue.
    pub fn queue(&self, shard: u32) -> Option<&ShardQueue> {
        self.shard(shard).map(ShardState::queue)
    }

    /// Shard `i`'s high-water mark (default when none seen yet).
    pub fn high_water(&self, shard: u32) -> HighWater {
        self.shard(shard)
            .map(ShardState::high_water)
            .unwrap_or_default()
    }
    /// See [`ShardState::take_behind`].
    pub fn take_behind(&self, shard: u32, seen: &HighWater, found: u64) -> Option<Gap> {
        self.shard(shard)?.take_behind(seen, found)
    }
    /// See [`ShardState::saw`].
    pub fn saw(&self, shard: u32, epoch: &str, seq: u64, promised: bool) {
        if let Some(s) = self.shard(shard) {
            s.saw(epoch, seq, promised);
        }
    }
    pub fn start_ms(&self) -> i64 {
        self.activity.start_at_ms
    }
    pub fn end_ms(&self) -> i64 {
        self.activity.end_at_ms
    }
    pub fn is_available(&self) -> bool {
        self.gate.is_open()
    }
    /// True while a rebuild (one a call waits for too), the start-up check or an open
    /// holds the entry.
    pub fn is_claimed(&self) -> bool {
        self.gate.is_claimed()
    }
    /// Takes the claim when nobody holds it. Let go with `App::open_and_release` or
    /// `App::release_claim`.
    pub fn try_claim(&self) -> bool {
        self.gate.try_claim()
    }
    /// Item ids in creation order.
    pub fn item_ids(&self) -> Vec<u64> {
        self.activity.items.iter().map(|i| i.id).collect()
    }
}

fn activity_shards(a: &pb::Activity) -> u32 {
    a.shard_count.max(1)
}

/// Published activities by id.
#[derive(Debug, Default)]
pub struct Catalog {
    map: RwLock<HashMap<u64, Arc<ActivityEntry>>>,
    loaded: AtomicBool,
    /// Set once the start-up check has claimed every entry it checks (or at the first
    /// load, when there is none): before, the fence check opens nothing. See
    /// [`Self::may_open`].
    opening: AtomicBool,
}

impl Catalog {
    pub fn get(&self, id: u64) -> Option<Arc<ActivityEntry>> {
        self.map.read().expect("catalog lock").get(&id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<ActivityEntry>> {
        self.map
            .read()
            .expect("catalog lock")
            .values()
            .cloned()
            .collect()
    }

    /// Adds the activity unless present; returns the entry in the catalog and whether
    /// it was added.
    pub fn insert(&self, activity: pb::Activity, available: bool) -> (Arc<ActivityEntry>, bool) {
        let mut map = self.map.write().expect("catalog lock");
        if let Some(e) = map.get(&activity.id) {
            return (e.clone(), false);
        }
        let e = Arc::new(ActivityEntry::new(activity, available));
        map.insert(e.id(), e.clone());
        (e, true)
    }

    /// True once the first load from MySQL succeeded; before, Reserve is UNAVAILABLE.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Loaded, and every activity whose window is open has its shards open: the
    /// readiness behind health SERVING.
    pub fn is_ready(&self, now_ms: i64) -> bool {
        self.is_loaded()
            && self
                .all()
                .iter()
                .all(|e| e.end_ms() <= now_ms || e.is_available())
    }

    pub fn set_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    /// Whether the fence check may open a closed entry. Not before the start-up check
    /// (`stock.recompute_at_start`) has claimed the entries it checks: a fresh process
    /// has no high-water marks, so the fence check alone cannot tell a shard that came
    /// back rewound (MySQL holds reservations past its sequence), and an entry it
    /// opened before the start-up check reached it sold on that shard, reusing
    /// reservation ids that orderd then dead-letters. Read before the entry's
    /// claim (Acquire), which the claims set before this flag (Release).
    pub fn may_open(&self) -> bool {
        self.opening.load(Ordering::Acquire)
    }

    /// See [`Self::may_open`].
    pub fn set_opening(&self) {
        self.opening.store(true, Ordering::Release);
    }
}
