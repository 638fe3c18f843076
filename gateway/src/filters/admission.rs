//! The admission cap, after the body: a reserve takes an in-flight slot of its item
//! (`crate::admission` holds the cap and the slot guard), or 429 `busy`.

use super::{Cx, Filter, Flow};
use crate::admission::admit;
use crate::answer::Refusal;

/// The filter (reserve only; the window filter found the item).
pub struct Admission;

impl Filter for Admission {
    fn name(&self) -> &'static str {
        "admission"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let Some(item) = cx.item.as_ref() else {
            return Flow::Go;
        };
        let a = &cx.policy.admission;
        match admit(item, a.k, a.min_in_flight) {
            Some(slot) => {
                cx.admitted = Some(slot);
                Flow::Go
            }
            None => Flow::Stop(Refusal::Busy),
        }
    }
}
