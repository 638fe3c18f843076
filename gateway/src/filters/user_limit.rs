//! The per-user token bucket, once authentication named the user.

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::rate_limit::Take;

/// The per-user bucket, once the user is known.
pub struct UserLimit;

impl Filter for UserLimit {
    fn name(&self) -> &'static str {
        "user_limit"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let Some(user) = cx.user.as_deref() else {
            return Flow::Go;
        };
        match cx
            .shared
            .limiter
            .check_user(user, &cx.policy.limits, cx.now_ms)
        {
            Take::Allowed => Flow::Go,
            Take::Limited { retry_after_secs } => {
                Flow::Stop(Refusal::RateLimited(retry_after_secs))
            }
        }
    }
}
