//! After the crowd: wait for the drain (every reservation an order, nothing in flight),
//! pay a share of the orders through the edge, then gather the facts from MySQL and from
//! `AdminService.Reconcile` and judge them ([`evaluate`], pure and unit-tested).
//!
//! The checks:
//! - `no_oversell`: per item, active orders (PENDING + PAID) ≤ stock in MySQL, and
//!   Reconcile's difference is never negative (Redis handed out no unit it did not have).
//! - `one_order_per_user_per_item`: no (user, item) with two active orders in MySQL, and
//!   no user answered 202 with two distinct reservation ids for one item.
//! - `idempotent_retries`: a resent request (same request id) got the same reservation.
//! - `redis_agrees_with_mysql`: Reconcile says consistent for every item, nothing left in
//!   flight, and MySQL's own stock column equals stock − active orders.
//! - `every_reserved_request_has_an_order`: every id answered 202 is a row of `orders`
//!   (dead-lettered ids are reported, and count as lost: they are not orders).
//! - `every_unit_sold` (only judged with `--expect-sold-out`): sold = stock for each item.
//!
//! (Over 400 lines with its tests: [`evaluate`] is small, the table of cases that
//! proves each check can fail is most of it.)

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;

mod sources;
pub use sources::*;

/// Reconcile's view of one item.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Reconciled {
    pub redis_remaining: i64,
    pub in_flight: i64,
    pub active_orders: i64,
    pub mysql_stock: i64,
    pub difference: i64,
    pub consistent: bool,
    pub message: String,
}

/// One item's facts after the drain.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ItemFacts {
    pub item_id: u64,
    pub title: String,
    /// Units put on sale (`total_stock`).
    pub stock: u64,
    /// MySQL's `stock` column: units not taken by an active order.
    pub mysql_stock: i64,
    /// Order rows by MySQL status (PENDING, PAID, CANCELLED, FAILED).
    pub orders_by_state: BTreeMap<String, u64>,
    pub reconcile: Option<Reconciled>,
}

impl ItemFacts {
    /// Active orders: PENDING + PAID.
    pub fn sold(&self) -> u64 {
        ["PENDING", "PAID"]
            .iter()
            .map(|s| self.orders_by_state.get(*s).copied().unwrap_or(0))
            .sum()
    }

    /// Units sold beyond the stock, by MySQL or by Redis' reckoning.
    pub fn oversold(&self) -> u64 {
        let mysql = self.sold().saturating_sub(self.stock);
        let redis = self
            .reconcile
            .as_ref()
            .map_or(0, |r| (-r.difference).max(0) as u64);
        mysql.max(redis)
    }
}

/// Everything the checks look at.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub items: Vec<ItemFacts>,
    /// (user, item) with more than one active order in MySQL.
    pub mysql_duplicates: BTreeSet<(String, u64)>,
    /// (user, item) answered 202 with two distinct reservation ids.
    pub client_duplicates: BTreeSet<(String, u64)>,
    pub idempotency_violations: u64,
    /// Every reservation id answered 202.
    pub reserved: BTreeSet<String>,
    /// Every order id of the activity in MySQL.
    pub order_ids: HashSet<String>,
    /// Reservation ids in the dead-letter table.
    pub dead_lettered: HashSet<String>,
    /// Of the orders no 202 named, how many their buyer found in `GET /api/v1/orders`
    /// (`None` when not looked up).
    pub unacknowledged_visible: Option<u64>,
    /// Why Reconcile could not be asked, if it could not.
    pub reconcile_error: Option<String>,
    pub expect_sold_out: bool,
}

/// One judged check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// Not judged (e.g. `every_unit_sold` without `--expect-sold-out`): never fails.
    pub informational: bool,
    pub detail: String,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub oversold: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub dead_lettered: u64,
    /// Orders of the activity that no 202 of this run named.
    pub unacknowledged: u64,
    pub checks: Vec<Check>,
    pub passed: bool,
}

/// Judges the facts; pure.
pub fn evaluate(f: &Facts) -> Verdict {
    let mut checks = Vec::new();

    let oversold: u64 = f.items.iter().map(ItemFacts::oversold).sum();
    let over: Vec<String> = f
        .items
        .iter()
        .filter(|i| i.oversold() > 0)
        .map(|i| format!("item {}: {} sold of {}", i.item_id, i.sold(), i.stock))
        .collect();
    checks.push(Check {
        name: "no_oversell",
        ok: oversold == 0,
        informational: false,
        detail: if over.is_empty() {
            "active orders ≤ stock for every item (MySQL and Reconcile)".into()
        } else {
            over.join("; ")
        },
    });

    let dup_pairs: BTreeSet<_> = f.mysql_duplicates.union(&f.client_duplicates).collect();
    let duplicates = dup_pairs.len() as u64;
    checks.push(Check {
        name: "one_order_per_user_per_item",
        ok: duplicates == 0,
        informational: false,
        detail: format!(
            "{} (user, item) pairs with two active orders in MySQL, {} answered 202 twice with distinct ids",
            f.mysql_duplicates.len(),
            f.client_duplicates.len()
        ),
    });

    checks.push(Check {
        name: "idempotent_retries",
        ok: f.idempotency_violations == 0,
        informational: false,
        detail: format!(
            "{} resent requests answered with another reservation id",
            f.idempotency_violations
        ),
    });

    let mut disagree = Vec::new();
    if let Some(e) = &f.reconcile_error {
        disagree.push(format!("Reconcile failed: {e}"));
    }
    for i in &f.items {
        match &i.reconcile {
            None if f.reconcile_error.is_none() => {
                disagree.push(format!("item {}: missing from Reconcile", i.item_id))
            }
            None => {}
            Some(r) if !r.consistent || r.difference != 0 || r.in_flight != 0 => {
                disagree.push(format!(
                    "item {}: redis_remaining {} + in_flight {} + active {} vs total {} (difference {}) {}",
                    i.item_id,
                    r.redis_remaining,
                    r.in_flight,
                    r.active_orders,
                    i.stock,
                    r.difference,
                    r.message
                ))
            }
            Some(_) => {}
        }
        if i.mysql_stock + i.sold() as i64 != i.stock as i64 {
            disagree.push(format!(
                "item {}: MySQL stock {} + active orders {} != total {}",
                i.item_id,
                i.mysql_stock,
                i.sold(),
                i.stock
            ));
        }
    }
    checks.push(Check {
        name: "redis_agrees_with_mysql",
        ok: disagree.is_empty(),
        informational: false,
        detail: if disagree.is_empty() {
            "Reconcile consistent for every item, nothing in flight".into()
        } else {
            disagree.join("; ")
        },
    });

    let missing: Vec<&String> = f
        .reserved
        .iter()
        .filter(|id| !f.order_ids.contains(*id))
        .collect();
    let lost = missing.len() as u64;
    let dead_lettered = missing
        .iter()
        .filter(|id| f.dead_lettered.contains(**id))
        .count() as u64;
    checks.push(Check {
        name: "every_reserved_request_has_an_order",
        ok: lost == 0,
        informational: false,
        detail: if missing.is_empty() {
            format!("{} reservations, each an order in MySQL", f.reserved.len())
        } else {
            format!(
                "{lost} of {} reservations are not orders ({dead_lettered} dead-lettered), e.g. {}",
                f.reserved.len(),
                missing
                    .iter()
                    .take(5)
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    });

    // A reservation the server made while the client heard 503/timeout, and whose retry
    // then met the edge's sold-out flag: the order exists, the buyer was told no.
    let unacknowledged = f
        .order_ids
        .iter()
        .filter(|id| !f.reserved.contains(*id))
        .count() as u64;
    checks.push(Check {
        name: "every_order_was_answered_202",
        ok: unacknowledged == 0,
        informational: true,
        detail: match f.unacknowledged_visible {
            Some(v) if unacknowledged > 0 => format!(
                "{unacknowledged} orders whose buyer never got the 202 (a 503 or timeout, then no retry got through); {v} of them found by their buyer in GET /api/v1/orders"
            ),
            _ => format!("{unacknowledged} orders whose buyer never got the 202"),
        },
    });

    let unsold: Vec<String> = f
        .items
        .iter()
        .filter(|i| i.sold() < i.stock)
        .map(|i| format!("item {}: {} of {}", i.item_id, i.sold(), i.stock))
        .collect();
    checks.push(Check {
        name: "every_unit_sold",
        ok: unsold.is_empty(),
        informational: !f.expect_sold_out,
        detail: if unsold.is_empty() {
            "sold = stock for every item".into()
        } else {
            format!("unsold: {}", unsold.join("; "))
        },
    });

    let passed = checks.iter().all(|c| c.ok || c.informational);
    Verdict {
        oversold,
        duplicates,
        lost,
        dead_lettered,
        unacknowledged,
        checks,
        passed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: u64, stock: u64, pending: u64, paid: u64) -> ItemFacts {
        let mut orders_by_state = BTreeMap::new();
        orders_by_state.insert("PENDING".into(), pending);
        orders_by_state.insert("PAID".into(), paid);
        orders_by_state.insert("FAILED".into(), 3);
        ItemFacts {
            item_id: id,
            title: format!("item {id}"),
            stock,
            mysql_stock: stock as i64 - (pending + paid) as i64,
            orders_by_state,
            reconcile: Some(Reconciled {
                redis_remaining: stock as i64 - (pending + paid) as i64,
                active_orders: (pending + paid) as i64,
                consistent: true,
                ..Reconciled::default()
            }),
        }
    }

    fn clean() -> Facts {
        Facts {
            items: vec![item(1, 10, 6, 4), item(2, 5, 5, 0)],
            reserved: ["a".to_string(), "b".to_string()].into(),
            order_ids: ["a".to_string(), "b".to_string(), "c".to_string()].into(),
            expect_sold_out: true,
            ..Facts::default()
        }
    }

    fn check<'a>(v: &'a Verdict, name: &str) -> &'a Check {
        v.checks.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn a_clean_sold_out_sale_passes_every_check() {
        let v = evaluate(&clean());
        assert!(v.passed, "{v:#?}");
        assert_eq!((v.oversold, v.duplicates, v.lost), (0, 0, 0));
        // "c" is an order no 202 named: reported, not failed.
        assert_eq!(v.unacknowledged, 1);
        assert!(!check(&v, "every_order_was_answered_202").ok);
    }

    #[test]
    fn sold_counts_only_pending_and_paid_orders() {
        assert_eq!(item(1, 10, 6, 4).sold(), 10);
    }

    #[test]
    fn more_active_orders_than_stock_is_an_oversell() {
        let mut f = clean();
        f.items[0].orders_by_state.insert("PAID".into(), 6);
        let v = evaluate(&f);
        assert_eq!(v.oversold, 2);
        assert!(!check(&v, "no_oversell").ok);
        assert!(!v.passed);
    }

    #[test]
    fn a_negative_reconcile_difference_is_an_oversell_even_when_mysql_looks_fine() {
        let mut f = clean();
        f.items[1].reconcile.as_mut().unwrap().difference = -1;
        let v = evaluate(&f);
        assert_eq!(v.oversold, 1);
        assert!(!check(&v, "redis_agrees_with_mysql").ok);
    }

    #[test]
    fn a_reservation_without_an_order_is_lost_even_when_dead_lettered() {
        let mut f = clean();
        f.reserved.insert("z".into());
        f.reserved.insert("y".into());
        f.dead_lettered.insert("y".into());
        let v = evaluate(&f);
        assert_eq!(v.lost, 2);
        assert_eq!(v.dead_lettered, 1);
        assert!(!check(&v, "every_reserved_request_has_an_order").ok);
    }

    #[test]
    fn duplicates_seen_by_mysql_and_by_the_client_are_counted_once_per_pair() {
        let mut f = clean();
        f.mysql_duplicates.insert(("u1".into(), 1));
        f.client_duplicates.insert(("u1".into(), 1));
        f.client_duplicates.insert(("u2".into(), 2));
        let v = evaluate(&f);
        assert_eq!(v.duplicates, 2);
        assert!(!v.passed);
    }

    #[test]
    fn unsold_units_fail_only_when_a_sell_out_is_expected() {
        let mut f = clean();
        f.items[1].orders_by_state.insert("PENDING".into(), 4);
        f.items[1].mysql_stock = 1;
        f.items[1].reconcile.as_mut().unwrap().redis_remaining = 1;
        f.expect_sold_out = false;
        let v = evaluate(&f);
        assert!(v.passed, "{v:#?}");
        assert!(!check(&v, "every_unit_sold").ok);
        f.expect_sold_out = true;
        assert!(!evaluate(&f).passed);
    }

    #[test]
    fn units_still_in_flight_or_an_unreachable_stockd_fail_the_agreement_check() {
        let mut f = clean();
        f.items[0].reconcile.as_mut().unwrap().in_flight = 1;
        assert!(!check(&evaluate(&f), "redis_agrees_with_mysql").ok);
        let mut f = clean();
        f.reconcile_error = Some("connection refused".into());
        for i in &mut f.items {
            i.reconcile = None;
        }
        assert!(!evaluate(&f).passed);
    }

    #[test]
    fn a_retry_answered_with_another_reservation_fails() {
        let mut f = clean();
        f.idempotency_violations = 1;
        assert!(!evaluate(&f).passed);
    }

    #[test]
    fn the_payment_pick_is_stable_and_near_its_fraction() {
        let n = (0..10_000)
            .filter(|i| pick(&format!("1-2-3-x-{i}"), 0.5))
            .count();
        assert!((4_500..5_500).contains(&n), "{n}");
        assert_eq!(pick("abc", 0.3), pick("abc", 0.3));
        assert!(!pick("abc", 0.0));
    }

    #[test]
    fn passwords_are_hidden_in_urls() {
        assert_eq!(
            redact("mysql://root:secret@127.0.0.1/seckill"),
            "mysql://root:***@127.0.0.1/seckill"
        );
        assert_eq!(redact("mysql://root@h/db"), "mysql://root@h/db");
    }
}
