//! `POST .../items/{s}/challenge` (a signed proof-of-work puzzle for the authenticated
//! user, `crate::fair::challenge`) and the redeem step the token handler runs when the
//! activity's challenge is on. The sold-out, window and item checks ran before
//! (`filters::Window`): a sold-out item answers 410 before any challenge work.

use pingora::prelude::*;
use pingora::proxy::Session;
use serde_json::json;

use crate::answer::Refusal;
use crate::fair::challenge::Redeem;
use crate::fair::room::Gate;
use crate::proxy::{Ctx, Gateway, Req};

impl Gateway {
    /// The difficulty of `a` for this request's client; 0 = no challenge.
    pub(crate) fn challenge_bits(&self, ctx: &Ctx, req: &Req<'_>, a: u64) -> u32 {
        let act_bits = self
            .shared
            .catalog
            .get(a)
            .map_or(Some(0), |act| act.challenge_bits);
        self.shared
            .challenges
            .bits_for(a, act_bits, ctx.client_ip, req.now_ms)
    }

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
        let bits = self.challenge_bits(ctx, &req, a);
        if bits == 0 {
            return self
                .ok(session, ctx, 200, &json!({"required": false}))
                .await;
        }
        let is = self
            .shared
            .challenges
            .issue(uid, a, s, bits, req.now_unix_ms);
        let body = json!({
            "required": true,
            "challenge": is.puzzle,
            "algorithm": "sha256-leading-zero-bits",
            "seed": hex::encode(is.nonce),
            "bits": is.bits,
            "count": is.count,
            "expected_hashes": u64::from(is.count) << is.bits,
            "expires_at_ms": is.exp_ms,
        });
        self.ok(session, ctx, 200, &body).await
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
        if self.challenge_bits(ctx, req, a) == 0 {
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
