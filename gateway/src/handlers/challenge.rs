//! `POST .../items/{s}/challenge` (a signed proof-of-work puzzle for the authenticated
//! user, `crate::fair::challenge`) and the redeem step the token handler runs when the
//! activity's challenge is on. The sold-out, window and item checks ran before
//! (`filters::Window`): a sold-out item answers 410 before any challenge work.

use std::net::IpAddr;

use pingora::prelude::*;
use pingora::proxy::Session;

use crate::answer::Refusal;
use crate::fair::challenge::Redeem;
use crate::fair::room::Gate;
use crate::proxy::{Ctx, Gateway, Req};
use crate::shared::Shared;

/// The difficulty of `a` for a client at `ip`; 0 = no challenge.
pub(crate) fn challenge_bits(shared: &Shared, ip: IpAddr, a: u64, now_ms: u64) -> u32 {
    shared
        .challenges
        .bits_for(a, activity_bits(shared, a), ip, now_ms)
}

/// The activity's own `challenge_bits` (`Some(0)`, none, for an unknown activity).
fn activity_bits(shared: &Shared, a: u64) -> Option<u32> {
    shared
        .catalog
        .get(a)
        .map_or(Some(0), |act| act.challenge_bits)
}

/// Appends the body of the answer to a challenge request the waiting room let
/// through to `out`: `{"required": false}` when the activity asks none, else a signed
/// puzzle for `(user, a, s)`. The pipeline below and the fast lane
/// (`crate::fast_lane`, which writes it straight into the connection's output) both
/// answer with it.
pub(crate) fn challenge_body(
    shared: &Shared,
    ip: IpAddr,
    user: &str,
    (a, s): (u64, u64),
    now: (u64, u64),
    out: &mut Vec<u8>,
) {
    shared
        .challenges
        .answer_into(user, (a, s), (activity_bits(shared, a), ip), now, out);
}

impl Gateway {
    /// A puzzle for `(user, a, s)`, or `{"required": false}` when the activity asks
    /// none.
    pub(crate) async fn challenge(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        (a, s): (u64, u64),
    ) -> Result<bool> {
        // The waiting room first: no puzzle for a buyer it has not admitted.
        let uid = req.user.as_deref().unwrap_or_default();
        let headers = &session.req_header().headers;
        if let Gate::Refused(r) = self.shared.room.gate(a, uid, headers, req.now_unix_ms) {
            return self.refuse(session, ctx, r).await;
        }
        let mut body = Vec::with_capacity(512);
        challenge_body(
            &self.shared,
            ctx.client_ip,
            uid,
            (a, s),
            (req.now_ms, req.now_unix_ms),
            &mut body,
        );
        self.ok_bytes(session, ctx, 200, body.into()).await
    }

    /// The redeem step of the token handler: `Ok(())` when the activity asks no
    /// challenge or the body carries a good, unspent one (now spent); else the refusal.
    pub(crate) async fn redeem_challenge(
        &self,
        session: &mut Session,
        ctx: &Ctx,
        req: &Req<'_>,
        (a, s): (u64, u64),
    ) -> Result<std::result::Result<(), Refusal>> {
        if challenge_bits(&self.shared, ctx.client_ip, a, req.now_ms) == 0 {
            return Ok(Ok(()));
        }
        let has_body = session
            .req_header()
            .headers
            .contains_key(http::header::CONTENT_TYPE);
        let body = if has_body {
            match self.body(session, &req.policy.protection).await? {
                Ok(b) => Some(b),
                Err(r) => return Ok(Err(r)),
            }
        } else {
            None
        };
        let uid = req.user.as_deref().unwrap_or_default();
        let r = self
            .shared
            .challenges
            .redeem(
                body.as_ref(),
                uid,
                a,
                s,
                ctx.client_ip,
                req.now_ms,
                req.now_unix_ms,
            )
            .await;
        Ok(match r {
            Ok(()) => Ok(()),
            Err(Redeem::Rejected(rej)) => Err(Refusal::Challenge(rej)),
            Err(Redeem::Unavailable) => Err(Refusal::BackendUnavailable(
                self.shared.cfg.upstreams.retry_after_secs,
            )),
        })
    }
}
