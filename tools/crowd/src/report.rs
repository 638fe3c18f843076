//! The report: one [`Report`] value, written as `report.json`, drawn as `report.html`
//! (inline SVG, no external URL) and printed on the terminal.
//!
//! (Over 400 lines: the report's model, its terminal table and its HTML/SVG drawing
//! share one value and change together; the drawing is most of it.)

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::stats::{Percentiles, Second, Stats};
use crate::verify::{Check, ItemFacts, Reconciled, Verdict};

/// One item in the report.
#[derive(Debug, Clone, Serialize)]
pub struct ItemReport {
    pub item_id: u64,
    pub title: String,
    pub stock: u64,
    pub sold: u64,
    pub orders_by_state: BTreeMap<String, u64>,
    pub reconcile: Option<Reconciled>,
}

/// How the run was set up.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    pub gateway: String,
    pub activity_id: u64,
    pub activity_title: String,
    pub buyers: u64,
    pub rate_per_sec: f64,
    pub concurrency: usize,
    pub abusive_ips: u32,
    pub source: String,
    pub started_at_ms: i64,
    pub crowd_secs: f64,
    pub drain_secs: f64,
    pub drained: bool,
    pub login_requests: u64,
    pub login_failures: u64,
    /// Buyers whose login failed, so they never clicked.
    pub buyers_without_login: u64,
    /// Abusive IPs whose login failed (an address still banned by an earlier run, say):
    /// they hammer without a token, so the edge answers their requests 401 or 403.
    pub bots_without_login: u64,
    pub payments_applied: u64,
    /// Refused payments by cause (status and code).
    pub payments_refused: BTreeMap<String, u64>,
}

/// Everything report.json holds.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: RunInfo,
    pub items: Vec<ItemReport>,
    /// Orders of the activity by MySQL status, all items.
    pub orders_by_state: BTreeMap<String, u64>,
    /// Requests of the buy path (token + reserve routes); the answers add up to it.
    pub requests: u64,
    pub answers: BTreeMap<&'static str, u64>,
    /// What the `errors` answers were (status and code, or the transport error).
    pub errors_by_cause: BTreeMap<String, u64>,
    pub reservations: u64,
    pub oversold: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub dead_lettered: u64,
    /// Orders of the activity that no 202 of this run named (the buyer was told no).
    pub unacknowledged: u64,
    /// Percentiles per answer kind and `all`, milliseconds.
    pub latency_ms: BTreeMap<&'static str, Percentiles>,
    /// `[upper edge ms or null, count]` of all answers.
    pub latency_histogram: Vec<(Option<f64>, u64)>,
    pub throughput: Vec<Second>,
    pub checks: Vec<Check>,
    pub passed: bool,
}

impl Report {
    pub fn new(
        run: RunInfo,
        items: &[ItemFacts],
        stats: &Stats,
        errors_by_cause: BTreeMap<String, u64>,
        reservations: u64,
        v: Verdict,
    ) -> Self {
        let mut orders_by_state = BTreeMap::new();
        for i in items {
            for (s, n) in &i.orders_by_state {
                *orders_by_state.entry(s.clone()).or_insert(0) += n;
            }
        }
        Self {
            run,
            items: items
                .iter()
                .map(|i| ItemReport {
                    item_id: i.item_id,
                    title: i.title.clone(),
                    stock: i.stock,
                    sold: i.sold(),
                    orders_by_state: i.orders_by_state.clone(),
                    reconcile: i.reconcile.clone(),
                })
                .collect(),
            orders_by_state,
            requests: stats.requests(),
            answers: stats.answers(),
            errors_by_cause,
            reservations,
            oversold: v.oversold,
            duplicates: v.duplicates,
            lost: v.lost,
            dead_lettered: v.dead_lettered,
            unacknowledged: v.unacknowledged,
            latency_ms: stats.latency(),
            latency_histogram: stats
                .latency_buckets()
                .into_iter()
                .map(|(e, n)| (e.map(|us| us as f64 / 1000.0), n))
                .collect(),
            throughput: stats.throughput(),
            checks: v.checks,
            passed: v.passed,
        }
    }

    /// The terminal report.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let r = &self.run;
        let _ = writeln!(
            o,
            "\n== flash sale: activity {} \"{}\" via {}",
            r.activity_id, r.activity_title, r.gateway
        );
        let _ = writeln!(
            o,
            "   {} buyers at {:.0}/s (≤{} in flight, {} abusive IPs, source {}); crowd {:.1} s, drain {:.1} s{}",
            r.buyers,
            r.rate_per_sec,
            r.concurrency,
            r.abusive_ips,
            r.source,
            r.crowd_secs,
            r.drain_secs,
            if r.drained { "" } else { " (NOT drained)" }
        );
        let _ = writeln!(o, "\n-- items (sold = PENDING + PAID orders in MySQL)");
        let _ = writeln!(
            o,
            "   {:>6}  {:<24} {:>7} {:>7}  orders by state",
            "item", "title", "stock", "sold"
        );
        for i in &self.items {
            let states: Vec<String> = i
                .orders_by_state
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            let _ = writeln!(
                o,
                "   {:>6}  {:<24} {:>7} {:>7}  {}",
                i.item_id,
                truncate(&i.title, 24),
                i.stock,
                i.sold,
                states.join(", ")
            );
        }
        let states: Vec<String> = self
            .orders_by_state
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        let _ = writeln!(o, "   orders in MySQL: {}", states.join(", "));
        let _ = writeln!(
            o,
            "   payments through the edge: {} applied, {} refused {:?}",
            r.payments_applied,
            r.payments_refused.values().sum::<u64>(),
            r.payments_refused
        );
        let _ = writeln!(
            o,
            "\n-- answers ({} requests on the token and reserve routes; {} login requests, {} buyers without a login{})",
            self.requests,
            r.login_requests,
            r.buyers_without_login,
            match r.bots_without_login {
                0 => String::new(),
                n => format!(
                    ", {n} of {} abusive IPs without one: they send no token",
                    r.abusive_ips
                ),
            }
        );
        let _ = writeln!(
            o,
            "   {:<12} {:>9} {:>10} {:>10} {:>10} {:>10}",
            "kind", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        for (kind, n) in &self.answers {
            let p = self.latency_ms.get(kind);
            let _ = match p {
                Some(p) if *n > 0 => writeln!(
                    o,
                    "   {:<12} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                    kind, n, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
                ),
                _ => writeln!(o, "   {:<12} {:>9}", kind, n),
            };
        }
        for (cause, n) in &self.errors_by_cause {
            let _ = writeln!(o, "   {:<12} {:>9}  {}", "  errors:", n, cause);
        }
        if let Some(p) = self.latency_ms.get("all") {
            let _ = writeln!(
                o,
                "   {:<12} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                "all", p.count, p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
            );
        }
        let _ = writeln!(
            o,
            "\n-- checks (oversold {}, duplicates {}, lost {}, dead-lettered {})",
            self.oversold, self.duplicates, self.lost, self.dead_lettered
        );
        for c in &self.checks {
            let mark = match (c.ok, c.informational) {
                (true, _) => "PASS",
                (false, true) => "INFO",
                (false, false) => "FAIL",
            };
            let _ = writeln!(o, "   [{mark}] {:<38} {}", c.name, c.detail);
        }
        let _ = writeln!(
            o,
            "\n   {}",
            if self.passed {
                "ALL CHECKS PASSED"
            } else {
                "SOME CHECKS FAILED"
            }
        );
        o
    }

    /// report.html: tables plus two inline SVG charts; no external URL.
    pub fn html(&self) -> String {
        let mut o = String::new();
        let r = &self.run;
        let _ = write!(
            o,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Flash sale report</title>\
<style>body{{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330}}table{{border-collapse:collapse;margin:8px 0 20px}}\
td,th{{border:1px solid #ddd;padding:4px 8px;text-align:right}}th{{background:#f3f4f6}}td.l,th.l{{text-align:left}}\
.pass{{color:#15803d;font-weight:600}}.fail{{color:#b91c1c;font-weight:600}}.info{{color:#b45309}}svg text{{font:11px sans-serif}}</style></head><body>"
        );
        let _ = write!(
            o,
            "<h1>Flash sale report: activity {} “{}”</h1><p>{} buyers at {:.0}/s through {}; crowd {:.1} s, drain {:.1} s{}. \
             {} requests on the buy path. <b class=\"{}\">{}</b></p>",
            r.activity_id,
            esc(&r.activity_title),
            r.buyers,
            r.rate_per_sec,
            esc(&r.gateway),
            r.crowd_secs,
            r.drain_secs,
            if r.drained { "" } else { " (not drained)" },
            self.requests,
            if self.passed { "pass" } else { "fail" },
            if self.passed {
                "All checks passed"
            } else {
                "Some checks failed"
            }
        );
        o.push_str("<h2>Checks</h2><table><tr><th class=\"l\">check</th><th class=\"l\">result</th><th class=\"l\">detail</th></tr>");
        for c in &self.checks {
            let (cls, word) = match (c.ok, c.informational) {
                (true, _) => ("pass", "pass"),
                (false, true) => ("info", "info"),
                (false, false) => ("fail", "FAIL"),
            };
            let _ = write!(
                o,
                "<tr><td class=\"l\">{}</td><td class=\"l {cls}\">{word}</td><td class=\"l\">{}</td></tr>",
                c.name,
                esc(&c.detail)
            );
        }
        let _ = write!(
            o,
            "</table><p>oversold {} · duplicates {} · lost {} · dead-lettered {}</p>",
            self.oversold, self.duplicates, self.lost, self.dead_lettered
        );
        o.push_str("<h2>Items</h2><table><tr><th>item</th><th class=\"l\">title</th><th>stock</th><th>sold</th><th class=\"l\">orders by state</th></tr>");
        for i in &self.items {
            let states: Vec<String> = i
                .orders_by_state
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                i.item_id,
                esc(&i.title),
                i.stock,
                i.sold,
                esc(&states.join(", "))
            );
        }
        o.push_str("</table><h2>Answers and latency (ms)</h2><table><tr><th class=\"l\">kind</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>");
        for (kind, n) in &self.answers {
            let p = self.latency_ms.get(kind).filter(|_| *n > 0);
            let cells = p.map_or_else(
                || "<td></td><td></td><td></td><td></td>".to_string(),
                |p| {
                    format!(
                        "<td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td>",
                        p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms
                    )
                },
            );
            let _ = write!(o, "<tr><td class=\"l\">{kind}</td><td>{n}</td>{cells}</tr>");
        }
        o.push_str("</table><h2>Latency histogram (all answers)</h2>");
        o.push_str(&self.histogram_svg());
        o.push_str("<h2>Throughput over time (answers per second)</h2>");
        o.push_str(&self.throughput_svg());
        o.push_str("</body></html>\n");
        o
    }

    fn histogram_svg(&self) -> String {
        let (w, h, left, bottom) = (720.0, 240.0, 50.0, 40.0);
        let bars = &self.latency_histogram;
        let max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1) as f64;
        let bw = (w - left - 10.0) / bars.len().max(1) as f64;
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"latency histogram\">"
        );
        let _ = write!(
            s,
            "<line x1=\"{left}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"#999\"/>",
            y = h - bottom,
            x2 = w - 10.0
        );
        let _ = write!(
            s,
            "<text x=\"4\" y=\"14\">{}</text><text x=\"4\" y=\"{}\">0</text>",
            max as u64,
            h - bottom
        );
        for (i, (edge, n)) in bars.iter().enumerate() {
            let bh = (*n as f64 / max) * (h - bottom - 20.0);
            let x = left + i as f64 * bw;
            let label = match edge {
                Some(e) if *e < 1.0 => format!("<{e}"),
                Some(e) => format!("<{e:.0}"),
                None => "more".into(),
            };
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#d9262b\"><title>{} ms: {}</title></rect>",
                x + 1.0,
                h - bottom - bh,
                bw - 2.0,
                bh,
                label,
                n
            );
            let _ = write!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x + bw / 2.0,
                h - bottom + 14.0 + (i % 2) as f64 * 12.0,
                label
            );
        }
        s.push_str("</svg><p>Buckets: latency upper edge in ms (powers of two).</p>");
        s
    }

    fn throughput_svg(&self) -> String {
        let (w, h, left, bottom) = (720.0, 260.0, 50.0, 30.0);
        let t = &self.throughput;
        let max = t.iter().map(|s| s.total).max().unwrap_or(0).max(1) as f64;
        let n = t.len().max(1) as f64;
        let x = |i: usize| left + (i as f64 + 0.5) / n * (w - left - 10.0);
        let y = |v: u64| h - bottom - (v as f64 / max) * (h - bottom - 20.0);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"throughput over time\">"
        );
        let _ = write!(
            s,
            "<line x1=\"{left}\" y1=\"{b}\" x2=\"{x2}\" y2=\"{b}\" stroke=\"#999\"/><text x=\"4\" y=\"14\">{}/s</text><text x=\"4\" y=\"{b}\">0</text>",
            max as u64,
            b = h - bottom,
            x2 = w - 10.0
        );
        let series: [(&str, &str, Option<crate::stats::Kind>); 4] = [
            ("all", "#334155", None),
            ("reserved", "#15803d", Some(crate::stats::Kind::Reserved)),
            ("sold_out", "#d9262b", Some(crate::stats::Kind::SoldOut)),
            ("limited", "#b45309", Some(crate::stats::Kind::Limited)),
        ];
        for (k, (name, color, kind)) in series.iter().enumerate() {
            let pts: Vec<String> = t
                .iter()
                .enumerate()
                .map(|(i, sec)| {
                    let v = match kind {
                        None => sec.total,
                        Some(k) => sec.by_kind.get(k).copied().unwrap_or(0),
                    };
                    format!("{:.1},{:.1}", x(i), y(v))
                })
                .collect();
            let _ = write!(
                s,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                pts.join(" ")
            );
            let _ = write!(
                s,
                "<rect x=\"{}\" y=\"6\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"15\">{name}</text>",
                left + 20.0 + k as f64 * 100.0,
                left + 34.0 + k as f64 * 100.0
            );
        }
        let _ = write!(
            s,
            "<text x=\"{left}\" y=\"{}\">0 s</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} s</text></svg>",
            h - 8.0,
            w - 10.0,
            h - 8.0,
            t.len()
        );
        s
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// HTML-escapes text.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Kind;
    use crate::verify::{evaluate, Facts};
    use std::time::Duration;

    fn sample() -> Report {
        let mut stats = Stats::new();
        for i in 0..50 {
            stats.record(
                Kind::SoldOut,
                Duration::from_micros(300 + i),
                Duration::from_millis(i * 40),
            );
        }
        stats.record(
            Kind::Reserved,
            Duration::from_millis(4),
            Duration::from_millis(10),
        );
        let mut orders = BTreeMap::new();
        orders.insert("PENDING".to_string(), 1);
        let items = vec![ItemFacts {
            item_id: 7,
            title: "Phone <b>".into(),
            stock: 1,
            mysql_stock: 0,
            orders_by_state: orders,
            reconcile: Some(Reconciled {
                active_orders: 1,
                consistent: true,
                ..Reconciled::default()
            }),
        }];
        let facts = Facts {
            items: items.clone(),
            reserved: ["r1".to_string()].into(),
            order_ids: ["r1".to_string()].into(),
            expect_sold_out: true,
            ..Facts::default()
        };
        let run = RunInfo {
            gateway: "http://127.0.0.1:8080".into(),
            activity_id: 1,
            activity_title: "Launch".into(),
            buyers: 51,
            rate_per_sec: 100.0,
            concurrency: 10,
            abusive_ips: 0,
            source: "bind".into(),
            started_at_ms: 0,
            crowd_secs: 2.0,
            drain_secs: 0.5,
            drained: true,
            login_requests: 51,
            login_failures: 0,
            buyers_without_login: 0,
            bots_without_login: 0,
            payments_applied: 0,
            payments_refused: BTreeMap::new(),
        };
        Report::new(run, &items, &stats, BTreeMap::new(), 1, evaluate(&facts))
    }

    #[test]
    fn report_json_has_the_keys_the_issue_names() {
        let v = serde_json::to_value(sample()).unwrap();
        for k in [
            "requests",
            "answers",
            "oversold",
            "duplicates",
            "lost",
            "latency_ms",
            "items",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        let item = &v["items"][0];
        for k in ["stock", "sold", "orders_by_state"] {
            assert!(item.get(k).is_some(), "item misses {k}");
        }
        assert_eq!(v["requests"], 51);
        assert_eq!(v["answers"]["sold_out"], 50);
        assert_eq!(v["items"][0]["sold"], 1);
        assert_eq!(v["passed"], true);
        assert!(v["latency_ms"]["all"]["p99_ms"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn the_html_report_is_self_contained_and_escaped() {
        let html = sample().html();
        assert!(html.contains("<svg"));
        assert!(html.contains("polyline"));
        assert!(html.contains("Phone &lt;b&gt;"));
        // The only URL is the SVG namespace, which is not fetched.
        let without_ns = html.replace("http://www.w3.org/2000/svg", "");
        let without_gw = without_ns.replace("http://127.0.0.1:8080", "");
        assert!(!without_gw.contains("http://") && !without_gw.contains("https://"));
        assert!(!html.contains("<script src"));
    }

    #[test]
    fn the_terminal_report_shows_items_kinds_and_checks() {
        let t = sample().text();
        assert!(t.contains("sold_out"));
        assert!(t.contains("[PASS] no_oversell"));
        assert!(t.contains("ALL CHECKS PASSED"));
    }

    #[test]
    fn abusive_ips_that_could_not_log_in_are_named_in_the_answers_line() {
        assert!(!sample().text().contains("abusive IPs without one"));
        let mut r = sample();
        r.run.abusive_ips = 3;
        r.run.bots_without_login = 2;
        assert!(r.text().contains(
            "0 buyers without a login, 2 of 3 abusive IPs without one: they send no token)"
        ));
        assert_eq!(
            serde_json::to_value(&r).unwrap()["run"]["bots_without_login"],
            2
        );
    }
}
