//! The sold-out short-circuit, before authentication: a reserve of an item whose
//! shards are all empty is answered 410 from memory (`crate::sold_out`, fed by the
//! shard keys and pub/sub), with no JWT work and no backend call.

use std::sync::atomic::Ordering;

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::routes::Route;

/// Before authentication: a reserve of a sold-out item is answered 410 at once.
pub struct SoldOutEarly;

impl Filter for SoldOutEarly {
    fn name(&self) -> &'static str {
        "sold_out"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        if let Route::Reserve(a, s) = cx.route {
            if let Some(act) = cx.shared.catalog.get(*a) {
                if let Some(item) = act.item(*s) {
                    if item.sold_out.load(Ordering::Relaxed)
                        && cx.now_unix_ms as i64 >= act.start_ms
                    {
                        return Flow::Stop(Refusal::SoldOut);
                    }
                }
            }
        }
        Flow::Go
    }
}
