//! The per-IP and per-route token buckets, before authentication. The one filter that
//! takes something in the edge list: [`Filter::peek`] looks at the buckets without
//! taking, for the fast lane.

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::rate_limit::Take;

/// Filter step: the per-IP and per-route buckets, before authentication.
pub struct IpLimit;

impl Filter for IpLimit {
    fn name(&self) -> &'static str {
        "ip_limit"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let policy = cx.policy;
        match cx
            .shared
            .limiter
            .check_ip(cx.client_ip, cx.route.class(), &policy.limits, cx.now_ms)
        {
            Take::Allowed => Flow::Go,
            Take::Limited { retry_after_secs } => {
                Flow::Stop(Refusal::RateLimited(retry_after_secs))
            }
        }
    }

    fn peek(&self, cx: &mut Cx<'_>) -> Flow {
        match cx.shared.limiter.peek_ip(
            cx.client_ip,
            cx.route.class(),
            &cx.policy.limits,
            cx.now_ms,
        ) {
            Take::Allowed => Flow::Go,
            Take::Limited { retry_after_secs } => {
                Flow::Stop(Refusal::RateLimited(retry_after_secs))
            }
        }
    }

    fn takes(&self) -> bool {
        true
    }
}
