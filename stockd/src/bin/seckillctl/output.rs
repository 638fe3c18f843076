//! Rendering answers as JSON (`--json`, for scripts) or as short human text.

use serde_json::{json, Value};

use seckill_proto::pb;

fn ms_text(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

fn status_name(s: i32) -> &'static str {
    match pb::ActivityStatus::try_from(s) {
        Ok(pb::ActivityStatus::Draft) => "DRAFT",
        Ok(pb::ActivityStatus::Scheduled) => "SCHEDULED",
        Ok(pb::ActivityStatus::Published) => "PUBLISHED",
        _ => "UNSPECIFIED",
    }
}

pub fn activity(a: &pb::Activity) -> Value {
    json!({
        "id": a.id,
        "title": a.title,
        "start_at_ms": a.start_at_ms,
        "end_at_ms": a.end_at_ms,
        "start_at": ms_text(a.start_at_ms),
        "end_at": ms_text(a.end_at_ms),
        "shard_count": a.shard_count,
        "per_user_limit": a.per_user_limit,
        "status": status_name(a.status),
        "publish_at_ms": a.publish_at_ms,
        "version": a.version,
        "items": a.items.iter().map(|i| json!({
            "id": i.id,
            "title": i.title,
            "price_cents": i.price_cents,
            "sale_price_cents": i.sale_price_cents,
            "stock": i.stock,
        })).collect::<Vec<_>>(),
    })
}

pub fn activity_text(a: &pb::Activity) -> String {
    let mut s = format!(
        "activity {} \"{}\" {} shards={} window {} .. {}",
        a.id,
        a.title,
        status_name(a.status),
        a.shard_count,
        ms_text(a.start_at_ms),
        ms_text(a.end_at_ms)
    );
    if a.publish_at_ms != 0 {
        s.push_str(&format!(" publish_at {}", ms_text(a.publish_at_ms)));
    }
    for i in &a.items {
        s.push_str(&format!(
            "\n  item {} \"{}\" stock={} price={} sale={}",
            i.id, i.title, i.stock, i.price_cents, i.sale_price_cents
        ));
    }
    s
}

pub fn item_status(i: &pb::ItemStatus) -> Value {
    json!({
        "item_id": i.item_id,
        "total": i.total,
        "remaining": i.remaining,
        "shard_remaining": i.shard_remaining,
        "reserved": i.reserved,
        "sold_out": i.sold_out,
        "available": i.available,
        "gave_up": i.gave_up,
    })
}

pub fn item_status_text(i: &pb::ItemStatus) -> String {
    format!(
        "  item {} total={} remaining={} reserved={} sold_out={} available={} gave_up={} shards={:?}",
        i.item_id, i.total, i.remaining, i.reserved, i.sold_out, i.available, i.gave_up,
        i.shard_remaining
    )
}

pub fn reconciliation(r: &pb::ItemReconciliation) -> Value {
    json!({
        "item_id": r.item_id,
        "total": r.total,
        "redis_remaining": r.redis_remaining,
        "in_flight": r.in_flight,
        "active_orders": r.active_orders,
        "mysql_stock": r.mysql_stock,
        "difference": r.difference,
        "consistent": r.consistent,
        "repaired": r.repaired,
        "message": r.message,
    })
}

pub fn reconciliation_text(r: &pb::ItemReconciliation) -> String {
    format!(
        "item {} total={} redis_remaining={} in_flight={} active_orders={} mysql_stock={} difference={} consistent={} repaired={} ({})",
        r.item_id, r.total, r.redis_remaining, r.in_flight, r.active_orders, r.mysql_stock,
        r.difference, r.consistent, r.repaired, r.message
    )
}

pub fn ban(b: &pb::Ban) -> Value {
    json!({"cidr": b.cidr, "expires_at_ms": b.expires_at_ms, "reason": b.reason})
}

pub fn ban_text(b: &pb::Ban) -> String {
    let until = if b.expires_at_ms == 0 {
        "until unbanned".to_string()
    } else {
        format!("until {}", ms_text(b.expires_at_ms))
    };
    format!("{} {} {}", b.cidr, until, b.reason)
}

/// Prints `value` as JSON or `text` as is.
pub fn print(json_out: bool, value: Value, text: String) {
    if json_out {
        println!("{value}");
    } else {
        println!("{text}");
    }
}
