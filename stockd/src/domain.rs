//! Inputs parsed at the door into types that cannot be malformed: user and request
//! ids, activity specs. Every check names the request field it refuses.

use crate::error::{invalid, Result};

pub use seckill_lua::{RequestId, UserId};

/// `s` as a user id (the rule is `seckill_lua::user`), refused naming `field`.
pub fn user_id(field: &str, s: &str) -> Result<UserId> {
    UserId::parse(s).map_err(|e| invalid(field, e.to_string()))
}

/// `s` as a request id (the rule is `seckill_lua::user`), refused naming `field`.
pub fn request_id(field: &str, s: &str) -> Result<RequestId> {
    RequestId::parse(s).map_err(|e| invalid(field, e.to_string()))
}

tokio::task_local! {
    /// The buyer's W3C `traceparent` (validated) of the Reserve call this task serves:
    /// `service.rs` sets it around `App::reserve`, and the shard queue (`batch.rs`)
    /// reads it when it queues the reservation, so the trace reaches the stream entry
    /// without a parameter through every layer between.
    pub static TRACE_PARENT: Option<std::sync::Arc<str>>;
}

/// The `traceparent` of the Reserve call this task serves, if any.
pub fn current_trace_parent() -> Option<std::sync::Arc<str>> {
    TRACE_PARENT.try_with(Clone::clone).ok().flatten()
}

/// Largest `per_user_limit` of an activity, and so the largest quantity of one
/// reservation.
pub const MAX_PER_USER_LIMIT: u32 = 100;

/// A Reserve quantity: 0 (unset) means 1; above [`MAX_PER_USER_LIMIT`] is refused
/// here (the activity's own limit is checked once the activity is known).
pub fn quantity(field: &str, q: u32) -> Result<u32> {
    match q {
        0 => Ok(1),
        q if q > MAX_PER_USER_LIMIT => Err(invalid(
            field,
            format!("must be 1..={MAX_PER_USER_LIMIT} and at most the activity's per_user_limit"),
        )),
        q => Ok(q),
    }
}

/// A positive id (activity or item).
pub fn positive_id(field: &str, id: u64) -> Result<u64> {
    if id == 0 {
        return Err(invalid(field, "must be set (non-zero)"));
    }
    Ok(id)
}

/// A new item, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewItem {
    pub title: String,
    pub price_cents: i64,
    pub sale_price_cents: i64,
    pub stock: u32,
}

/// A new activity, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewActivity {
    pub title: String,
    pub start_at_ms: i64,
    pub end_at_ms: i64,
    pub shard_count: u32,
    pub per_user_limit: u32,
    pub items: Vec<NewItem>,
    /// Proof-of-work bits per sub-puzzle at the edge (0 = off).
    pub challenge_bits: u32,
    /// The named Redis Cluster of its stock; empty = the default cluster. Checked
    /// against stockd's `[redis.clusters]` by the admin call, not here.
    pub redis_cluster: String,
}

/// Most proof-of-work bits per sub-puzzle an activity may ask: 32 sub-puzzles of 24
/// bits are ~5·10^8 hashes, minutes on a phone; beyond is a lock-out.
pub const MAX_CHALLENGE_BITS: u32 = 24;

/// Largest stock of one item (keeps every count in i64 and in MySQL's INT UNSIGNED).
pub const MAX_ITEM_STOCK: u32 = 100_000_000;
/// Most items in one activity.
pub const MAX_ITEMS: usize = 100;

fn check_title(field: &str, t: &str) -> Result<String> {
    let t = t.trim();
    if t.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if t.chars().count() > 200 {
        return Err(invalid(field, "must be at most 200 characters"));
    }
    if t.chars().any(char::is_control) {
        return Err(invalid(field, "must not hold control characters"));
    }
    Ok(t.to_string())
}

impl NewActivity {
    /// Validates a CreateActivity request. The shard count must be given (1..=1024):
    /// issue 3 lists 0 as bad input.
    pub fn parse(req: &seckill_proto::pb::CreateActivityRequest) -> Result<Self> {
        let title = check_title("title", &req.title)?;
        // Sanity bounds: 2000-01-01 .. 2200-01-01.
        let (lo, hi) = (946_684_800_000_i64, 7_258_118_400_000_i64);
        if !(lo..hi).contains(&req.start_at_ms) {
            return Err(invalid(
                "start_at_ms",
                "must be a unix ms time between 2000 and 2200",
            ));
        }
        if !(lo..hi).contains(&req.end_at_ms) {
            return Err(invalid(
                "end_at_ms",
                "must be a unix ms time between 2000 and 2200",
            ));
        }
        if req.end_at_ms <= req.start_at_ms {
            return Err(invalid("end_at_ms", "must be after start_at_ms"));
        }
        let shard_count = req.shard_count;
        if !(1..=seckill_lua::MAX_SHARDS).contains(&shard_count) {
            return Err(invalid("shard_count", "must be 1..=1024"));
        }
        let per_user_limit = if req.per_user_limit == 0 {
            1
        } else {
            req.per_user_limit
        };
        if per_user_limit > MAX_PER_USER_LIMIT {
            return Err(invalid(
                "per_user_limit",
                format!("must be 1..={MAX_PER_USER_LIMIT} (0 means 1)"),
            ));
        }
        if req.challenge_bits > MAX_CHALLENGE_BITS {
            return Err(invalid(
                "challenge_bits",
                format!("must be 0..={MAX_CHALLENGE_BITS} (0 = no challenge)"),
            ));
        }
        let redis_cluster = match seckill_daemon::config::named_cluster(req.redis_cluster.trim()) {
            None => String::new(),
            Some(name) => {
                if let Some(problem) = seckill_daemon::config::cluster_name_problem(name) {
                    return Err(invalid("redis_cluster", problem));
                }
                name.to_string()
            }
        };
        if req.items.is_empty() {
            return Err(invalid("items", "must hold at least one item"));
        }
        if req.items.len() > MAX_ITEMS {
            return Err(invalid("items", format!("at most {MAX_ITEMS} items")));
        }
        let mut items = Vec::with_capacity(req.items.len());
        for (k, it) in req.items.iter().enumerate() {
            let f = |name: &str| format!("items[{k}].{name}");
            let title = check_title(&f("title"), &it.title)?;
            if it.price_cents < 0 {
                return Err(invalid(&f("price_cents"), "must not be negative"));
            }
            if it.sale_price_cents <= 0 {
                return Err(invalid(&f("sale_price_cents"), "must be > 0"));
            }
            if it.stock == 0 {
                return Err(invalid(&f("stock"), "must be >= 1"));
            }
            if it.stock > MAX_ITEM_STOCK {
                return Err(invalid(
                    &f("stock"),
                    format!("must be at most {MAX_ITEM_STOCK}"),
                ));
            }
            items.push(NewItem {
                title,
                price_cents: it.price_cents,
                sale_price_cents: it.sale_price_cents,
                stock: it.stock,
            });
        }
        Ok(Self {
            title,
            start_at_ms: req.start_at_ms,
            end_at_ms: req.end_at_ms,
            shard_count,
            per_user_limit,
            items,
            challenge_bits: req.challenge_bits,
            redis_cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_short_printable_and_free_of_the_separator() {
        assert!(user_id("user_id", "alice-1").is_ok());
        assert!(request_id("request_id", &"x".repeat(64)).is_ok());
        for bad in ["", "a|b", "a b", "a\nb", &"x".repeat(65)] {
            let e = user_id("user_id", bad).unwrap_err().to_string();
            assert!(e.starts_with("user_id: "), "{e}");
        }
    }

    #[test]
    fn a_quantity_defaults_to_one_and_is_bounded() {
        assert_eq!(quantity("quantity", 0).unwrap(), 1);
        assert_eq!(quantity("quantity", 7).unwrap(), 7);
        assert_eq!(quantity("quantity", MAX_PER_USER_LIMIT).unwrap(), 100);
        for bad in [MAX_PER_USER_LIMIT + 1, u32::MAX] {
            let e = quantity("quantity", bad).unwrap_err().to_string();
            assert!(e.starts_with("quantity: "), "{e}");
        }
    }

    #[test]
    fn a_redis_cluster_is_a_name_and_default_means_none() {
        let req = |cluster: &str| seckill_proto::pb::CreateActivityRequest {
            title: "t".into(),
            start_at_ms: 1_900_000_000_000,
            end_at_ms: 1_900_000_060_000,
            shard_count: 8,
            redis_cluster: cluster.into(),
            items: vec![seckill_proto::pb::ItemSpec {
                title: "i".into(),
                price_cents: 2,
                sale_price_cents: 1,
                stock: 1,
            }],
            ..Default::default()
        };
        for (given, kept) in [
            ("", ""),
            ("default", ""),
            (" hot ", "hot"),
            ("hot-2_b", "hot-2_b"),
        ] {
            assert_eq!(
                NewActivity::parse(&req(given)).unwrap().redis_cluster,
                kept,
                "{given:?}"
            );
        }
        for bad in ["Hot", "a b", "a.b", &"x".repeat(33)] {
            let e = NewActivity::parse(&req(bad)).unwrap_err().to_string();
            assert!(e.starts_with("redis_cluster: "), "{bad:?}: {e}");
        }
    }
}
