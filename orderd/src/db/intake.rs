//! Intake: a batch of stream entries becomes orders in ONE transaction. The steps of
//! [`Db::try_write`], in the order they run:
//!
//! 1. [`load_items`]: the batch's items (locked on the second try);
//! 2. [`existing_orders`]: reservation ids already ordered (redeliveries);
//! 3. [`active_holders`]: users who already hold an active order of these items;
//! 4. [`classify`]: each entry in stream order: already there, poison, a second order
//!    of a holder, or a claim on a unit;
//! 5. [`allot_units`]: how many units each item gives (locked: exactly what MySQL
//!    has; optimistic: all of them, or give up for the locked try);
//! 6. [`insert_orders`], [`insert_stock_log`], [`insert_failed_returns`]: the rows;
//! 7. [`take_units`]: `stock -= k` under the `stock >= k` guard (first when locked,
//!    last when optimistic, so the hot row lock is held only until commit).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::NaiveDateTime;
use sqlx::{MySql, QueryBuilder, Row, Transaction};

use super::{Db, Written};
use crate::error::{Error, Result};
use crate::model::{now, Reservation, ReturnReason, Status};

/// `failure_reason` of an order MySQL had no unit for.
pub const SOLD_OUT_AFTER_ALL: &str = "sold out after all: no unit left in MySQL stock";
/// `failure_reason` of an order whose user already holds an active order of the item.
pub const ALREADY_HOLDS: &str = "the user already holds an active order for this item";

/// Start of the poison reason of a reservation id that names another buyer's order.
pub const COLLISION: &str = "reservation id handed out twice";

/// Rows per multi-row `INSERT`.
const INSERT_CHUNK: usize = 1000;

#[derive(Debug)]
struct ItemRow {
    activity_id: u64,
    sale_price_cents: i64,
    stock: u32,
}

/// What became of each entry so far (`None`: not decided yet), by batch position.
type Outcomes = Vec<Option<Written>>;

impl Db {
    /// Writes a batch of reservations in ONE transaction and says what became of
    /// each (same order as `batch`). Safe to call again with the same entries: an
    /// existing order id is [`Written::Already`].
    ///
    /// Units are taken per item under the `stock >= k` guard, in stream order: when
    /// MySQL has fewer units than the batch wants, the first ones get them and the
    /// rest become `FAILED` (sold out after all) with an outbox row that drops their
    /// Redis buyer record without returning a unit.
    ///
    /// Two tries: first optimistic (the hot item row is locked only by the closing
    /// guarded `UPDATE`, so batches of one item overlap their inserts and hold the row
    /// lock only until commit); when MySQL turns out to lack units for the whole batch,
    /// that transaction rolls back and the batch is redone with the item rows locked
    /// first, deciding exactly which entries get a unit.
    pub async fn write_batch(
        &self,
        batch: &[Reservation],
        pay_timeout: Duration,
    ) -> Result<Vec<Written>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(done) = self.try_write(batch, pay_timeout, false).await? {
            return Ok(done);
        }
        match self.try_write(batch, pay_timeout, true).await? {
            Some(done) => Ok(done),
            None => Err(Error::Internal(
                "the locked batch path did not decide".into(),
            )),
        }
    }

    /// One try of [`Self::write_batch`]; `None` when optimistic and a guard failed
    /// (rolled back).
    async fn try_write(
        &self,
        batch: &[Reservation],
        pay_timeout: Duration,
        lock_first: bool,
    ) -> Result<Option<Vec<Written>>> {
        let created = now();
        let deadline = created + chrono::Duration::milliseconds(pay_timeout.as_millis() as i64);
        let mut tx = self.pool.begin().await?;

        let mut item_ids: Vec<u64> = batch.iter().map(|r| r.rid.item).collect();
        item_ids.sort_unstable();
        item_ids.dedup();
        let items = load_items(&mut tx, &item_ids, lock_first).await?;
        let existing = existing_orders(&mut tx, batch).await?;
        let holders = active_holders(&mut tx, batch, &item_ids).await?;
        let (mut out, wanted) = classify(batch, &items, &existing, holders);
        let Some(mut takes) = allot_units(&mut out, batch, &wanted, &items, lock_first) else {
            return Ok(None);
        };
        takes.sort_unstable();
        if lock_first && !take_units(&mut tx, &takes).await? {
            return Err(Error::Internal(
                "a stock guard failed under its row lock".into(),
            ));
        }

        let new: Vec<(usize, &Reservation)> = batch
            .iter()
            .enumerate()
            .filter(|(k, _)| matches!(out[*k], Some(Written::Pending | Written::Failed(_))))
            .collect();
        insert_orders(&mut tx, &new, &out, &items, deadline, created).await?;
        let with = |w: Written| -> Vec<&Reservation> {
            new.iter()
                .filter(|(k, _)| out[*k].as_ref() == Some(&w))
                .map(|(_, r)| *r)
                .collect()
        };
        insert_stock_log(&mut tx, &with(Written::Pending), created).await?;
        insert_failed_returns(&mut tx, &with(Written::Failed(SOLD_OUT_AFTER_ALL)), created).await?;
        // Optimistic: the row lock of each item is taken here, held until commit.
        if !lock_first && !take_units(&mut tx, &takes).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        tx.commit().await?;
        Ok(Some(
            out.into_iter()
                .map(|w| w.unwrap_or(Written::Already))
                .collect(),
        ))
    }
}

/// Step 1: the items, locked when `lock_first` (consumers of one item serialize).
async fn load_items(
    tx: &mut Transaction<'_, MySql>,
    item_ids: &[u64],
    lock_first: bool,
) -> Result<HashMap<u64, ItemRow>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT id, activity_id, sale_price_cents, stock FROM activity_items WHERE id IN (",
    );
    let mut sep = q.separated(", ");
    for id in item_ids {
        sep.push_bind(*id);
    }
    q.push(if lock_first {
        ") ORDER BY id FOR UPDATE"
    } else {
        ") ORDER BY id"
    });
    Ok(q.build()
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|r| {
            (
                r.get::<u64, _>(0),
                ItemRow {
                    activity_id: r.get(1),
                    sale_price_cents: r.get(2),
                    stock: r.get(3),
                },
            )
        })
        .collect())
}

/// Step 2: orders that already exist, with the buyer and request they were made for:
/// redeliveries, or (another buyer) a reservation id Redis handed out twice.
async fn existing_orders(
    tx: &mut Transaction<'_, MySql>,
    batch: &[Reservation],
) -> Result<HashMap<String, (String, String)>> {
    let mut q =
        QueryBuilder::<MySql>::new("SELECT id, user_id, request_id FROM orders WHERE id IN (");
    let mut sep = q.separated(", ");
    for r in batch {
        sep.push_bind(r.rid.to_string());
    }
    q.push(")");
    Ok(q.build()
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|r| (r.get::<String, _>(0), (r.get(1), r.get(2))))
        .collect())
}

/// Step 3: users who already hold an active order of these items. Point lookups in
/// the unique (user, activity, item, active) index: the item's index would scan every
/// order of a hot item, per batch.
async fn active_holders(
    tx: &mut Transaction<'_, MySql>,
    batch: &[Reservation],
    item_ids: &[u64],
) -> Result<HashSet<(String, u64)>> {
    let mut q = QueryBuilder::<MySql>::new(
        "SELECT user_id, item_id FROM orders FORCE INDEX (uq_orders_active_buyer) \
         WHERE user_id IN (",
    );
    let mut sep = q.separated(", ");
    for r in batch {
        sep.push_bind(r.user.clone());
    }
    q.push(") AND item_id IN (");
    let mut sep = q.separated(", ");
    for id in item_ids {
        sep.push_bind(*id);
    }
    q.push(") AND active = 1");
    Ok(q.build()
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .map(|r| (r.get::<String, _>(0), r.get::<u64, _>(1)))
        .collect())
}

/// Step 4: classifies in stream order; returns the outcomes decided so far and, per
/// item, the batch positions that claim a unit of it.
fn classify(
    batch: &[Reservation],
    items: &HashMap<u64, ItemRow>,
    existing: &HashMap<String, (String, String)>,
    mut holders: HashSet<(String, u64)>,
) -> (Outcomes, HashMap<u64, Vec<usize>>) {
    let mut out: Outcomes = vec![None; batch.len()];
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut wanted: HashMap<u64, Vec<usize>> = HashMap::new();
    for (k, r) in batch.iter().enumerate() {
        let id = r.rid.to_string();
        if let Some((user, request)) = existing.get(&id) {
            out[k] = Some(if *user == r.user && *request == r.request {
                Written::Already
            } else {
                // The same id for another buyer: Redis lost the first reservation's
                // writes (a failover) and handed its sequence out again before a
                // rebuild. Not a redelivery: dead-lettered, visible, never dropped.
                Written::Poison(format!(
                    "{COLLISION}: {id} is already the order of user {user} (request {request})"
                ))
            });
            continue;
        }
        match seen.get(&id) {
            // The same entry twice in one batch (a claim and a read of it).
            Some(&j) if batch[j].user == r.user && batch[j].request == r.request => {
                out[k] = Some(Written::Already);
                continue;
            }
            // Two buyers under one id in one batch: the collision above, before the
            // first of them is written.
            Some(&j) => {
                out[k] = Some(Written::Poison(format!(
                    "{COLLISION}: {id} is already the reservation of user {} (request {})",
                    batch[j].user, batch[j].request
                )));
                continue;
            }
            None => {
                seen.insert(id, k);
            }
        }
        match items.get(&r.rid.item) {
            None => {
                out[k] = Some(Written::Poison(format!(
                    "item {} does not exist in MySQL",
                    r.rid.item
                )))
            }
            Some(item) if item.activity_id != r.rid.activity => {
                out[k] = Some(Written::Poison(format!(
                    "item {} does not belong to activity {}",
                    r.rid.item, r.rid.activity
                )))
            }
            Some(_) => {
                if !holders.insert((r.user.clone(), r.rid.item)) {
                    out[k] = Some(Written::Failed(ALREADY_HOLDS));
                } else {
                    wanted.entry(r.rid.item).or_default().push(k);
                }
            }
        }
    }
    (out, wanted)
}

/// Step 5: units per item, each reservation its quantity. Locked: exactly what MySQL
/// has, in stream order (a reservation whose k no longer fits fails; a later smaller
/// one may still fit). Optimistic: all of them, or `None` when an item lacks units
/// (the batch is redone locked).
fn allot_units(
    out: &mut Outcomes,
    batch: &[Reservation],
    wanted: &HashMap<u64, Vec<usize>>,
    items: &HashMap<u64, ItemRow>,
    lock_first: bool,
) -> Option<Vec<(u64, u32)>> {
    let mut takes: Vec<(u64, u32)> = Vec::new();
    for (item_id, ks) in wanted {
        let stock = u64::from(items[item_id].stock);
        let want: u64 = ks.iter().map(|k| u64::from(batch[*k].quantity)).sum();
        if !lock_first && stock < want {
            return None;
        }
        let mut take = 0u64;
        for k in ks {
            let q = u64::from(batch[*k].quantity);
            out[*k] = Some(if take + q <= stock {
                take += q;
                Written::Pending
            } else {
                Written::Failed(SOLD_OUT_AFTER_ALL)
            });
        }
        if take > 0 {
            takes.push((*item_id, take as u32));
        }
    }
    Some(takes)
}

/// Step 6a: the order rows, `PENDING` with a payment deadline or `FAILED` with reason.
async fn insert_orders(
    tx: &mut Transaction<'_, MySql>,
    new: &[(usize, &Reservation)],
    out: &Outcomes,
    items: &HashMap<u64, ItemRow>,
    deadline: NaiveDateTime,
    created: NaiveDateTime,
) -> Result<()> {
    for chunk in new.chunks(INSERT_CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO orders (id, activity_id, item_id, user_id, request_id, shard, \
             quantity, amount_cents, status, pay_deadline, failure_reason, reserved_at, \
             created_at) ",
        );
        q.push_values(chunk, |mut b, (k, r)| {
            let (status, deadline, reason) = match &out[*k] {
                Some(Written::Failed(why)) => (Status::Failed, None, Some(*why)),
                _ => (Status::Pending, Some(deadline), None),
            };
            b.push_bind(r.rid.to_string())
                .push_bind(r.rid.activity)
                .push_bind(r.rid.item)
                .push_bind(r.user.clone())
                .push_bind(r.request.clone())
                .push_bind(r.rid.shard)
                .push_bind(r.quantity)
                .push_bind(items[&r.rid.item].sale_price_cents * i64::from(r.quantity))
                .push_bind(status.as_str())
                .push_bind(deadline)
                .push_bind(reason)
                .push_bind(crate::model::from_ms(r.ts_ms))
                .push_bind(created);
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Step 6b: one stock log row (-quantity) per new `PENDING` order.
async fn insert_stock_log(
    tx: &mut Transaction<'_, MySql>,
    pending: &[&Reservation],
    created: NaiveDateTime,
) -> Result<()> {
    for chunk in pending.chunks(INSERT_CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO stock_log (item_id, order_id, delta, reason, created_at) ",
        );
        q.push_values(chunk, |mut b, r| {
            b.push_bind(r.rid.item)
                .push_bind(r.rid.to_string())
                .push_bind(-i64::from(r.quantity))
                .push_bind("ORDER")
                .push_bind(created);
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Step 6c: an outbox row per order that failed for want of a MySQL unit: the relay
/// drops its Redis buyer record without returning a unit.
async fn insert_failed_returns(
    tx: &mut Transaction<'_, MySql>,
    sold_out: &[&Reservation],
    created: NaiveDateTime,
) -> Result<()> {
    for chunk in sold_out.chunks(INSERT_CHUNK) {
        let mut q = QueryBuilder::<MySql>::new(
            "INSERT INTO stock_return_outbox (order_id, activity_id, item_id, user_id, reason, created_at) ",
        );
        q.push_values(chunk, |mut b, r| {
            b.push_bind(r.rid.to_string())
                .push_bind(r.rid.activity)
                .push_bind(r.rid.item)
                .push_bind(r.user.clone())
                .push_bind(ReturnReason::Failed.as_str())
                .push_bind(created);
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// Step 7: `stock -= k` under the `stock >= k` guard for each `(item, k)` (in item
/// order); false when a guard failed.
async fn take_units(tx: &mut Transaction<'_, MySql>, takes: &[(u64, u32)]) -> Result<bool> {
    for (item, k) in takes {
        let done = sqlx::query(
            "UPDATE activity_items SET stock = stock - ?, version = version + 1 \
             WHERE id = ? AND stock >= ?",
        )
        .bind(*k)
        .bind(*item)
        .bind(*k)
        .execute(&mut **tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(rid: &str, user: &str, request: &str) -> Reservation {
        Reservation {
            rid: rid.parse().unwrap(),
            user: user.into(),
            request: request.into(),
            quantity: 1,
            ts_ms: 0,
            trace_id: None,
        }
    }

    #[test]
    fn one_id_twice_in_a_batch_is_a_redelivery_only_for_the_same_buyer_and_request() {
        let items = HashMap::from([(
            7,
            ItemRow {
                activity_id: 1,
                sale_price_cents: 100,
                stock: 10,
            },
        )]);
        let batch = [
            entry("1-7-0-e1-1", "alice", "r1"),
            entry("1-7-0-e1-1", "alice", "r1"),
            // The same id for another buyer (Redis lost the first one's writes and
            // handed the sequence out again): never silently taken for a redelivery.
            entry("1-7-0-e1-1", "bob", "r9"),
        ];
        let (out, wanted) = classify(&batch, &items, &HashMap::new(), HashSet::new());
        assert_eq!(out[0], None, "the first is written");
        assert_eq!(wanted.get(&7), Some(&vec![0]));
        assert_eq!(out[1], Some(Written::Already));
        match &out[2] {
            Some(Written::Poison(why)) => {
                assert!(why.starts_with(COLLISION), "{why}");
                assert!(why.contains("alice"), "{why}");
            }
            other => panic!("a collision, not {other:?}"),
        }
    }
}
