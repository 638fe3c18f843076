//! The order domain: states, rows, stream entries and the outcomes of transitions,
//! parsed at the door into types so the rest of the crate never re-checks them.

use chrono::{DateTime, NaiveDateTime, Utc};
use seckill_lua::messages::entry;
use seckill_lua::ReservationId;
use seckill_proto::pb;

/// An order's state in MySQL (`orders.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    Paid,
    Cancelled,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Paid => "PAID",
            Self::Cancelled => "CANCELLED",
            Self::Failed => "FAILED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "PENDING" => Self::Pending,
            "PAID" => Self::Paid,
            "CANCELLED" => Self::Cancelled,
            "FAILED" => Self::Failed,
            _ => return None,
        })
    }

    pub fn to_pb(self) -> pb::OrderState {
        match self {
            Self::Pending => pb::OrderState::PendingPayment,
            Self::Paid => pb::OrderState::Paid,
            Self::Cancelled => pb::OrderState::Cancelled,
            Self::Failed => pb::OrderState::Failed,
        }
    }

    /// Every state, for the orders-by-state gauge.
    pub const ALL: [Status; 4] = [Self::Pending, Self::Paid, Self::Cancelled, Self::Failed];
}

/// One row of `orders`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderRow {
    pub id: String,
    pub activity_id: u64,
    pub item_id: u64,
    pub user_id: String,
    /// Units the order holds (>= 1).
    pub quantity: u32,
    pub amount_cents: i64,
    pub status: String,
    pub pay_deadline: Option<NaiveDateTime>,
    pub paid_at: Option<NaiveDateTime>,
    pub provider_ref: Option<String>,
    pub failure_reason: Option<String>,
    pub reserved_at: NaiveDateTime,
    pub created_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
}

/// Columns of [`OrderRow`], for `SELECT`s.
pub const ORDER_COLUMNS: &str =
    "id, activity_id, item_id, user_id, quantity, amount_cents, status, \
     pay_deadline, paid_at, provider_ref, failure_reason, reserved_at, created_at, updated_at";

impl OrderRow {
    pub fn status(&self) -> Status {
        Status::parse(&self.status).unwrap_or(Status::Failed)
    }

    pub fn to_pb(&self) -> pb::Order {
        let status = self.status();
        pb::Order {
            id: self.id.clone(),
            activity_id: self.activity_id,
            item_id: self.item_id,
            user_id: self.user_id.clone(),
            state: status.to_pb() as i32,
            amount_cents: self.amount_cents,
            created_at_ms: ms(self.created_at),
            pay_deadline_ms: match status {
                Status::Pending => self.pay_deadline.map(ms).unwrap_or(0),
                _ => 0,
            },
            paid_at_ms: self.paid_at.map(ms).unwrap_or(0),
            updated_at_ms: ms(self.updated_at),
            provider_ref: self.provider_ref.clone().unwrap_or_default(),
            failure_reason: self.failure_reason.clone().unwrap_or_default(),
            quantity: self.quantity,
        }
    }
}

/// Unix ms of a UTC `DATETIME`.
pub fn ms(t: NaiveDateTime) -> i64 {
    t.and_utc().timestamp_millis()
}

/// Now, UTC, at millisecond precision (what `DATETIME(3)` stores).
pub fn now() -> NaiveDateTime {
    from_ms(Utc::now().timestamp_millis())
}

/// A UTC `DATETIME` from unix ms (clamped to the epoch on nonsense).
pub fn from_ms(ms: i64) -> NaiveDateTime {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .naive_utc()
}

/// Largest quantity of one reservation (stockd's largest `per_user_limit`); a larger
/// `q` in a stream entry is poison.
pub const MAX_QUANTITY: u32 = 100;

/// A reservation read from an `sk:{a:i}:orders` stream entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub rid: ReservationId,
    pub user: String,
    pub request: String,
    /// Units reserved (the entry's `q`; 1 without it).
    pub quantity: u32,
    /// When Redis reserved it, unix ms.
    pub ts_ms: i64,
    /// The trace id of the buyer's request (from the entry's `tp`, a W3C
    /// `traceparent`); `None` when absent or malformed (never poison: tracing does not
    /// hold up an order).
    pub trace_id: Option<String>,
}

impl Reservation {
    /// Parses an entry's fields; `Err` says why it is poison.
    pub fn from_fields(fields: &std::collections::HashMap<String, String>) -> Result<Self, String> {
        let get = |k: &str| {
            fields
                .get(k)
                .ok_or_else(|| format!("entry lacks field `{k}`"))
        };
        let rid: ReservationId = get(entry::RESERVATION)?
            .parse()
            .map_err(|e| format!("field `rid`: {e}"))?;
        let user = get(entry::USER)?.clone();
        if user.is_empty() || user.len() > seckill_lua::MAX_ID_LEN {
            return Err("field `uid`: must be 1..=64 bytes".into());
        }
        let request = fields.get(entry::REQUEST).cloned().unwrap_or_default();
        if request.len() > seckill_lua::MAX_ID_LEN {
            return Err("field `req`: longer than 64 bytes".into());
        }
        let quantity =
            seckill_lua::messages::quantity(fields.get(entry::QUANTITY).map(String::as_str))
                .filter(|&q| q <= MAX_QUANTITY)
                .ok_or_else(|| format!("field `q`: must be 1..={MAX_QUANTITY}"))?;
        let ts_ms = get(entry::TIMESTAMP)?
            .parse::<i64>()
            .map_err(|_| "field `ts`: not an integer".to_string())?;
        for (k, want) in [(entry::ACTIVITY, rid.activity), (entry::ITEM, rid.item)] {
            if let Some(v) = fields.get(k) {
                if v.parse::<u64>().ok() != Some(want) {
                    return Err(format!("field `{k}`: does not match the reservation id"));
                }
            }
        }
        let trace_id = fields
            .get(entry::TRACE_PARENT)
            .and_then(|tp| seckill_proto::trace::TraceParent::parse(tp))
            .map(|tp| tp.trace_id().to_string());
        Ok(Self {
            rid,
            user,
            request,
            quantity,
            ts_ms,
            trace_id,
        })
    }
}

/// How a pay or cancel request ended (an error is something else: bad input, not
/// found, database down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// This call made the change.
    Applied,
    /// Already in the requested state; nothing changed.
    Already,
    /// Another transition won first; the order holds its final state.
    Conflict,
}

impl Change {
    pub fn to_pb(self) -> pb::ChangeOutcome {
        match self {
            Self::Applied => pb::ChangeOutcome::Applied,
            Self::Already => pb::ChangeOutcome::Already,
            Self::Conflict => pb::ChangeOutcome::Conflict,
        }
    }
}

/// Why a stock unit goes back (`stock_log.reason`, `stock_return_outbox.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnReason {
    /// Cancelled by its owner: the unit returns to MySQL and Redis.
    Cancel,
    /// Cancelled by the payment timeout: the unit returns to MySQL and Redis.
    Timeout,
    /// The order failed (sold out after all): MySQL never had the unit, so Redis
    /// only drops the buyer record.
    Failed,
}

impl ReturnReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "CANCEL",
            Self::Timeout => "TIMEOUT",
            Self::Failed => "FAILED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "CANCEL" => Self::Cancel,
            "TIMEOUT" => Self::Timeout,
            "FAILED" => Self::Failed,
            _ => return None,
        })
    }

    /// Whether Redis gets the unit back (the RELEASE script's ARGV[3]).
    pub fn returns_unit(self) -> bool {
        !matches!(self, Self::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_well_formed_entry_parses() {
        let r = Reservation::from_fields(&fields(&[
            ("rid", "1-2-3-abc-4"),
            ("uid", "u"),
            ("a", "1"),
            ("s", "2"),
            ("req", "r"),
            ("ts", "5"),
        ]))
        .unwrap();
        assert_eq!(r.rid.item, 2);
        assert_eq!(r.user, "u");
        assert_eq!(r.quantity, 1);
    }

    #[test]
    fn an_entry_with_q_holds_that_many_units_and_a_bad_q_is_poison() {
        let base = [
            ("rid", "1-2-3-abc-4"),
            ("uid", "u"),
            ("req", "r"),
            ("ts", "5"),
        ];
        let with = |q: &'static str| {
            let mut f = base.to_vec();
            f.push(("q", q));
            Reservation::from_fields(&fields(&f))
        };
        assert_eq!(with("3").unwrap().quantity, 3);
        for bad in ["0", "-2", "x", "101"] {
            assert!(with(bad).unwrap_err().contains("`q`"), "{bad}");
        }
    }

    #[test]
    fn an_entry_names_its_trace_id_and_a_bad_traceparent_is_dropped_not_poison() {
        let base = [
            ("rid", "1-2-3-abc-4"),
            ("uid", "u"),
            ("a", "1"),
            ("s", "2"),
            ("req", "r"),
            ("ts", "5"),
        ];
        let with = |tp: &'static str| {
            let mut f = base.to_vec();
            f.push(("tp", tp));
            Reservation::from_fields(&fields(&f)).unwrap().trace_id
        };
        assert_eq!(
            with("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(with("garbage"), None);
        assert_eq!(
            Reservation::from_fields(&fields(&base)).unwrap().trace_id,
            None
        );
    }

    #[test]
    fn poison_entries_say_why() {
        for (bad, why) in [
            (vec![("uid", "u"), ("ts", "1")], "rid"),
            (vec![("rid", "nope"), ("uid", "u"), ("ts", "1")], "rid"),
            (vec![("rid", "1-2-3-a-4"), ("uid", ""), ("ts", "1")], "uid"),
            (vec![("rid", "1-2-3-a-4"), ("uid", "u"), ("ts", "x")], "ts"),
            (
                vec![("rid", "1-2-3-a-4"), ("uid", "u"), ("ts", "1"), ("s", "9")],
                "`s`",
            ),
        ] {
            let e = Reservation::from_fields(&fields(&bad)).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn times_round_trip_through_unix_ms() {
        assert_eq!(ms(from_ms(1_790_000_000_123)), 1_790_000_000_123);
    }
}
