//! The order operations behind OrderService, with their inputs already parsed:
//! lookups (QUEUED from the activity's Redis cluster when MySQL has no row yet; the
//! only Redis read here), pay, cancel (MySQL only: the unit goes back through the
//! outbox relay of the activity's cluster), the provider
//! callback and dead-letter replay. [`crate::service`] only converts to and from the
//! wire types.

use std::collections::HashMap;
use std::sync::Arc;

use seckill_lua::ReservationId;
use seckill_proto::pb;

use crate::clusters::Clusters;
use crate::config::Config;
use crate::db::{Db, Written};
use crate::error::{Error, Result};
use crate::model::{Change, OrderRow, Reservation};
use crate::payment;

/// What `GetOrder` finds.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// The MySQL row.
    Stored(OrderRow),
    /// Reserved in Redis, not yet written to MySQL.
    Queued {
        rid: ReservationId,
        user: String,
        quantity: u32,
    },
}

impl Lookup {
    pub fn to_pb(&self) -> pb::Order {
        match self {
            Self::Stored(row) => row.to_pb(),
            Self::Queued {
                rid,
                user,
                quantity,
            } => pb::Order {
                id: rid.to_string(),
                activity_id: rid.activity,
                item_id: rid.item,
                user_id: user.clone(),
                state: pb::OrderState::Queued as i32,
                quantity: *quantity,
                ..Default::default()
            },
        }
    }

    /// True for PAID, CANCELLED and FAILED.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Stored(r) if r.status() != crate::model::Status::Pending)
    }
}

/// Outcome of a dead-letter replay.
#[derive(Debug, Default, Clone)]
pub struct Replay {
    pub replayed: u32,
    pub failed: u32,
    pub errors: Vec<String>,
}

/// The order operations; cheap to clone.
#[derive(Clone, Debug)]
pub struct Orders {
    pub db: Db,
    /// Every Redis cluster; a lookup goes to its activity's.
    pub clusters: Clusters,
    pub config: Arc<Config>,
}

impl Orders {
    /// The order `rid` as `user` may see it (`None`: an internal caller, who sees
    /// every stored order but cannot look up QUEUED ones, since buyer records are
    /// keyed by user).
    pub async fn get(&self, rid: &ReservationId, user: Option<&str>) -> Result<Lookup> {
        let id = rid.to_string();
        if let Some(row) = self.db.order(&id).await? {
            if user.is_some_and(|u| u != row.user_id) {
                return Err(Error::PermissionDenied);
            }
            return Ok(Lookup::Stored(row));
        }
        let Some(user) = user else {
            return Err(Error::NotFound("order"));
        };
        let held = self
            .clusters
            .for_activity(&self.db, rid.activity)
            .await?
            .redis
            .buyer_reservation(rid.activity, rid.shard, rid.item, user)
            .await?;
        if let Some((_, quantity)) = held.filter(|(h, _)| *h == id) {
            // The consumer may have written it between the two reads.
            if let Some(row) = self.db.order(&id).await? {
                return Ok(Lookup::Stored(row));
            }
            return Ok(Lookup::Queued {
                rid: rid.clone(),
                user: user.to_string(),
                quantity,
            });
        }
        Err(Error::NotFound("order"))
    }

    /// Dev payment: `PENDING → PAID`, only when `payment.dev_pay_enabled`.
    pub async fn pay(&self, rid: &ReservationId, user: &str) -> Result<(Change, OrderRow)> {
        if !self.config.payment.dev_pay_enabled {
            return Err(Error::FailedPrecondition(
                "the dev payment path is disabled (payment.dev_pay_enabled)",
            ));
        }
        self.stored_for(rid, user).await?;
        self.db.pay(&rid.to_string(), Some(user), None).await
    }

    /// `PENDING → CANCELLED` by the owner.
    pub async fn cancel(&self, rid: &ReservationId, user: &str) -> Result<(Change, OrderRow)> {
        self.stored_for(rid, user).await?;
        self.db.cancel(&rid.to_string(), Some(user)).await
    }

    /// NOT_FOUND/PERMISSION_DENIED before a transition; a QUEUED order cannot be
    /// paid or cancelled yet (FAILED_PRECONDITION).
    async fn stored_for(&self, rid: &ReservationId, user: &str) -> Result<()> {
        match self.get(rid, Some(user)).await? {
            Lookup::Stored(_) => Ok(()),
            Lookup::Queued { .. } => Err(Error::FailedPrecondition(
                "the order is still queued; retry in a moment",
            )),
        }
    }

    /// The provider's signed callback. Checks: signature, freshness, then (in the
    /// transaction) replay, amount, `PENDING → PAID`.
    pub async fn payment_callback(
        &self,
        rid: &ReservationId,
        amount_cents: i64,
        provider_ref: &str,
        timestamp_ms: i64,
        signature: &str,
        now_ms: i64,
    ) -> Result<(Change, OrderRow)> {
        let p = &self.config.payment;
        let id = rid.to_string();
        if !payment::verify(
            p.callback_secret.as_bytes(),
            &id,
            amount_cents,
            provider_ref,
            timestamp_ms,
            signature,
        ) {
            return Err(Error::BadSignature);
        }
        if !payment::fresh(timestamp_ms, now_ms, p.freshness_window_secs) {
            return Err(Error::invalid(
                "timestamp_ms",
                "outside the freshness window (stale or from the future)",
            ));
        }
        self.db
            .payment_callback(&id, amount_cents, provider_ref, timestamp_ms)
            .await
    }

    /// Replays dead letters (`ids`, or every unreplayed one when empty). Idempotent
    /// by order id: a letter whose order already exists is simply marked replayed.
    pub async fn replay(&self, ids: &[u64]) -> Result<Replay> {
        let rows = if ids.is_empty() {
            self.db.dead_letters(10_000, false).await?
        } else {
            self.db.dead_letters_by_id(ids).await?
        };
        let mut out = Replay::default();
        for id in ids {
            if !rows.iter().any(|r| r.id == *id) {
                out.failed += 1;
                out.errors.push(format!("dead letter {id}: not found"));
            }
        }
        for row in rows {
            if row.replayed_at.is_some() {
                out.failed += 1;
                out.errors
                    .push(format!("dead letter {}: already replayed", row.id));
                continue;
            }
            let parsed = serde_json::from_str::<HashMap<String, String>>(&row.payload)
                .map_err(|e| format!("payload is not a JSON object of strings: {e}"))
                .and_then(|f| Reservation::from_fields(&f));
            let why = match parsed {
                Err(why) => why,
                Ok(r) => match self
                    .db
                    .write_batch(std::slice::from_ref(&r), self.config.payment_timeout())
                    .await?
                    .pop()
                {
                    Some(Written::Poison(why)) => why,
                    _ => {
                        self.db.mark_replayed(row.id).await?;
                        out.replayed += 1;
                        continue;
                    }
                },
            };
            self.db.mark_replay_failed(row.id, &why).await?;
            out.failed += 1;
            out.errors.push(format!("dead letter {}: {why}", row.id));
        }
        Ok(out)
    }
}
