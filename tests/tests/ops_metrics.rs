//! The alert rules (`deploy/prometheus/alerts.yml`) and the dashboard
//! (`deploy/grafana/seckill.json`) name only metrics the daemons really export: the three
//! daemons run as processes, a sale goes through the edge, and every metric name in every
//! alert expression and dashboard query must appear in some daemon's `/metrics`.
//! Needs `cargo build -p stockd -p orderd -p gateway --bins` first.
#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use seckill_tests::gateway::{spawn_gateway, EdgeDeps};
use seckill_tests::orderd::spawn_orderd_process;
use seckill_tests::process::{free_port, wait_until_async};
use seckill_tests::stockd::{create_published_activity_with, spawn_stockd_process};
use seckill_tests::{init_tracing, Deps, RedisCluster, TestDb};

/// Named by the alerts or the dashboard before the change that exports them lands (none
/// now): each entry must still be named somewhere, and goes once the metric is exported.
const NOT_YET_EXPORTED: &[&str] = &[];

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// The metric names a PromQL expression reads. String literals, label matchers
/// (`{..}`), ranges (`[..]`) and label lists (`by (..)`, `without (..)`, `on (..)`,
/// `ignoring (..)`, `group_left (..)`, `group_right (..)`) are dropped first; what is
/// left that looks like a name and is not a function call, keyword or number is a metric.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut plain = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        let close = match c {
            '"' | '\'' | '`' => c,
            '{' => '}',
            '[' => ']',
            _ => {
                plain.push(c);
                continue;
            }
        };
        for d in chars.by_ref() {
            if d == close {
                break;
            }
        }
        plain.push(' ');
    }
    const CLAUSES: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset"];
    let words = |s: &str| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = None;
        for (i, c) in s.char_indices().chain([(s.len(), ' ')]) {
            let in_word = c.is_ascii_alphanumeric() || c == '_' || c == ':';
            match (start, in_word) {
                (None, true) => start = Some(i),
                (Some(b), false) => {
                    out.push((b, i));
                    start = None;
                }
                _ => {}
            }
        }
        out
    };
    // Drop the label lists of the clauses.
    let mut cut = String::new();
    let mut from = 0;
    for (b, e) in words(&plain) {
        if b < from || !CLAUSES.contains(&&plain[b..e]) {
            continue;
        }
        let after = &plain[e..];
        if let Some(open) = after.trim_start().strip_prefix('(') {
            let close =
                e + (after.len() - open.len()) + open.find(')').map_or(open.len(), |c| c + 1);
            cut.push_str(&plain[from..b]);
            from = close;
        }
    }
    cut.push_str(&plain[from..]);
    let mut names = BTreeSet::new();
    for (b, e) in words(&cut) {
        let word = &cut[b..e];
        let starts_like_a_name = word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        let number = cut[..b].ends_with(|c: char| c.is_ascii_digit() || c == '.');
        let call = cut[e..].trim_start().starts_with('(');
        if starts_like_a_name && !number && !call && !KEYWORDS.contains(&word) {
            names.insert(word.to_string());
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, outcome) (rate(gateway_request_duration_seconds_bucket{outcome="reserved",instance=~"$instance"}[5m]))) > 0.5 and orderd_stream_lag > 0 and deriv(orderd_stream_lag[5m]) > 1e3"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec![
            "gateway_request_duration_seconds_bucket",
            "orderd_stream_lag"
        ]
    );
}

/// Every `expr:` of the alert rules.
fn alert_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(deploy("prometheus/alerts.yml")).unwrap();
    // The exprs are plain scalars or `>-` folded blocks (lines indented deeper).
    let mut exprs = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((indent, value)) = line.split_once("expr:") else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('>') || value.starts_with('|') {
            let mut block = String::new();
            while let Some(next) = lines.peek() {
                if next.len() - next.trim_start().len() <= indent.len() {
                    break;
                }
                block.push_str(next.trim());
                block.push(' ');
                lines.next();
            }
            exprs.push(block);
        } else {
            exprs.push(value.to_string());
        }
    }
    assert!(exprs.len() >= 6, "{exprs:?}");
    exprs
}

/// Every `expr` of every panel target of the dashboard.
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(deploy("grafana/seckill.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(targets) = m.get("targets").and_then(|t| t.as_array()) {
                    for t in targets {
                        if let Some(e) = t.get("expr").and_then(|e| e.as_str()) {
                            out.push(e.to_string());
                        }
                    }
                }
                if let Some(panels) = m.get("panels") {
                    walk(panels, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|p| walk(p, out)),
            _ => {}
        }
    }
    walk(&dash, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    exprs
}

/// The sample names in a Prometheus text exposition.
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

async fn scrape(addr: &str) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("/metrics body")
}

#[tokio::test]
async fn every_metric_in_the_alerts_and_the_dashboard_is_exported_by_a_live_daemon() {
    init_tracing();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for e in alert_exprs().iter().chain(dashboard_exprs().iter()) {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric found in `{e}`");
        wanted.extend(names);
    }
    for name in NOT_YET_EXPORTED {
        assert!(
            wanted.contains(*name),
            "{name} is allowed as not yet exported but nothing names it: drop it from the list"
        );
    }

    let cluster = RedisCluster::start();
    let db = TestDb::create().await;
    let deps = Deps::new(&cluster, &db);
    let stockd = spawn_stockd_process(&deps, |_| {}).await;
    let orderd_admin = format!("127.0.0.1:{}", free_port(None));
    let mut orderd =
        spawn_orderd_process(&deps, |c| c.admin.listen = Some(orderd_admin.clone())).await;
    let gw = spawn_gateway(
        &EdgeDeps {
            redis: &cluster,
            stockd: &stockd.addr,
            orderd: &orderd.addr,
        },
        |_| {},
    )
    .await;

    // A small sale through the edge: two winners, a duplicate, a sold-out loser; orderd
    // turns the reservations into orders.
    let mut admin = stockd.admin_client().await;
    let act = create_published_activity_with(
        &mut admin,
        &[(2, 100)],
        2,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    let (a, s) = (act.id, act.items[0].id);
    gw.wait_activity(a).await;
    let mut first_order = None;
    for user in ["alice", "alice", "bob", "carol"] {
        let jwt = gw.dev_token(user).await;
        let path = format!("/api/v1/activities/{a}/items/{s}/token");
        let t = gw.post(&path, Some(&jwt), serde_json::json!({})).await;
        assert!(t.status < 500, "{user}: {} {}", t.status, t.body);
        if t.status != 200 {
            continue; // sold out: answered by the edge from memory
        }
        let token = t.body["purchase_token"].as_str().unwrap().to_string();
        let r = gw.reserve(&jwt, a, s, &token).await;
        assert!(r.status < 500, "{user}: {} {}", r.status, r.body);
        if r.status == 202 && first_order.is_none() {
            first_order = Some((jwt, r.body["order_id"].as_str().unwrap().to_string()));
        }
    }
    wait_until_async("both orders in MySQL", Duration::from_secs(20), || async {
        seckill_tests::orderd::count_all_orders(&db).await == 2
    })
    .await;

    // Names once seen stay exported. Gauges and vecs appear once their loops have run:
    // poll until every wanted name was seen or the time is up.
    let mut have = BTreeSet::new();
    let missing = |have: &BTreeSet<String>| -> BTreeSet<String> {
        wanted
            .iter()
            .filter(|n| !have.contains(*n) && !NOT_YET_EXPORTED.contains(&n.as_str()))
            .cloned()
            .collect()
    };
    // Seen only once the edge fails to reach a backend (a vec without label values is
    // not printed): the last step below makes that happen.
    const ON_UPSTREAM_ERROR: &str = "gateway_upstream_errors_total";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        have.extend(exported(&gw.metrics().await));
        have.extend(exported(&scrape(&stockd.admin_addr).await));
        have.extend(exported(&scrape(&orderd_admin).await));
        let left = missing(&have);
        if left.iter().all(|n| n == ON_UPSTREAM_ERROR) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // orderd gone: the edge answers an order lookup 503 and counts the upstream error.
    orderd.child.kill();
    let (jwt, order) = first_order.expect("a reservation");
    let r = gw.get(&format!("/api/v1/orders/{order}"), Some(&jwt)).await;
    assert_eq!(r.status, 503, "{}", r.body);
    have.extend(exported(&gw.metrics().await));

    let stale: Vec<_> = NOT_YET_EXPORTED
        .iter()
        .filter(|n| have.contains(**n))
        .collect();
    assert!(
        stale.is_empty(),
        "{stale:?} are exported now: remove them from NOT_YET_EXPORTED"
    );
    let left = missing(&have);
    assert!(
        left.is_empty(),
        "named in deploy/prometheus/alerts.yml or deploy/grafana/seckill.json but exported by no daemon: {left:?}"
    );
}
