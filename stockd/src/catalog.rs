//! The in-memory view of published activities: windows, shard counts and items, so
//! Reserve answers NOT_FOUND / NOT_STARTED / ENDED without a Redis call, and the
//! per-activity availability flag that keeps Reserve at UNAVAILABLE while the
//! activity's shards are being recomputed. Refreshed from MySQL by a background loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use seckill_proto::pb;

use crate::batch::ShardQueue;

/// One item of a published activity.
#[derive(Debug)]
pub struct ItemEntry {
    pub id: u64,
    /// Units put on sale.
    pub total: u32,
    /// SOLD_OUT answers given by this process while another shard still held units.
    pub false_sold_out: AtomicU64,
}

/// The highest reservation sequence this process has seen handed out in one shard,
/// with the epoch (fence value) it was handed out under. Redis never hands out a lower
/// one under the same epoch unless it lost writes; the reserve script and the fence
/// check compare against it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HighWater {
    pub epoch: String,
    pub seq: u64,
}

/// One published activity.
#[derive(Debug)]
pub struct ActivityEntry {
    pub activity: pb::Activity,
    pub items: HashMap<u64, ItemEntry>,
    /// False until the start-up fence check passed, and while recomputing.
    pub available: AtomicBool,
    /// True while a recompute task runs (at most one per activity and process).
    pub recomputing: AtomicBool,
    /// Rotating start of the donor scan, so rebalancing spreads over shards.
    pub rotation: AtomicU32,
    /// Per shard: the highest sequence seen handed out (see [`HighWater`]).
    high_water: Vec<Mutex<HighWater>>,
    /// Per shard: reservations waiting for the shard's next reserve call.
    queues: Vec<ShardQueue>,
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
                        false_sold_out: AtomicU64::new(0),
                    },
                )
            })
            .collect();
        Self {
            items,
            available: AtomicBool::new(available),
            recomputing: AtomicBool::new(false),
            rotation: AtomicU32::new(0),
            high_water: (0..activity_shards(&activity))
                .map(|_| Mutex::new(HighWater::default()))
                .collect(),
            queues: (0..activity_shards(&activity))
                .map(|_| ShardQueue::default())
                .collect(),
            activity,
        }
    }

    pub fn id(&self) -> u64 {
        self.activity.id
    }
    pub fn shards(&self) -> u32 {
        activity_shards(&self.activity)
    }
    /// Shard `shard`'s reservation queue.
    pub fn queue(&self, shard: u32) -> Option<&ShardQueue> {
        self.queues.get(shard as usize)
    }

    /// Shard `i`'s high-water mark (default when none seen yet).
    pub fn high_water(&self, shard: u32) -> HighWater {
        self.high_water
            .get(shard as usize)
            .map(|m| m.lock().expect("high-water lock").clone())
            .unwrap_or_default()
    }
    /// Redis showed `found` as shard `i`'s sequence, read after `seen` was taken from
    /// this mark. When the mark still holds `seen`'s epoch and `seen` is above `found`,
    /// Redis lost writes: clears the mark and returns the size of the gap, so the gap is
    /// reported once. (Comparing with a mark taken *before* the read matters: the mark
    /// moves on with every reservation, and one taken after the read would be ahead of
    /// a healthy Redis.)
    pub fn take_behind(&self, shard: u32, seen: &HighWater, found: u64) -> Option<u64> {
        let m = self.high_water.get(shard as usize)?;
        let mut hw = m.lock().expect("high-water lock");
        if hw.epoch == seen.epoch && seen.seq > found {
            let gap = hw.seq.max(seen.seq) - found;
            *hw = HighWater::default();
            return Some(gap);
        }
        None
    }
    /// Records that Redis handed out `seq` under `epoch` in `shard`. A newer epoch
    /// (a recompute opened the shard again) replaces the mark.
    pub fn saw(&self, shard: u32, epoch: &str, seq: u64) {
        let Some(m) = self.high_water.get(shard as usize) else {
            return;
        };
        let mut hw = m.lock().expect("high-water lock");
        if hw.epoch == epoch {
            hw.seq = hw.seq.max(seq);
        } else if epoch_newer(epoch, &hw.epoch) {
            *hw = HighWater {
                epoch: epoch.to_string(),
                seq,
            };
        }
    }
    pub fn start_ms(&self) -> i64 {
        self.activity.start_at_ms
    }
    pub fn end_ms(&self) -> i64 {
        self.activity.end_at_ms
    }
    pub fn is_available(&self) -> bool {
        self.available.load(Ordering::Acquire)
    }
    /// Item ids in creation order.
    pub fn item_ids(&self) -> Vec<u64> {
        self.activity.items.iter().map(|i| i.id).collect()
    }
}

fn activity_shards(a: &pb::Activity) -> u32 {
    a.shard_count.max(1)
}

/// Epochs are base-36 millisecond times without leading zeros: longer is newer, and
/// equal lengths compare as text.
fn epoch_newer(a: &str, b: &str) -> bool {
    (a.len(), a) > (b.len(), b)
}

/// Published activities by id.
#[derive(Debug, Default)]
pub struct Catalog {
    map: RwLock<HashMap<u64, Arc<ActivityEntry>>>,
    loaded: AtomicBool,
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
}
