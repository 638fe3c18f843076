#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! The main job, small: the `crowd` binary drives 2,000 buyers (retries, double clicks,
//! resent requests, two abusive IPs) through a full in-test stack — real Redis Cluster,
//! MariaDB, stockd, orderd and the gateway with production-like limits and the auto-ban
//! on — against 60 units over 3 items, and its report.json shows no oversell, no
//! duplicate, nothing lost and every unit sold.

use std::process::Command;
use std::time::Duration;

use seckill_tests::gateway::{bucket, set, GatewayHandle, Stack};
use seckill_tests::stockd::create_published_activity;
use seckill_tests::{init_tracing, SERVICE_TOKEN};
use serde_json::Value;

async fn wait_ready(gw: &GatewayHandle) {
    let url = format!("{}/readyz", gw.admin_url());
    for _ in 0..300 {
        if matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gateway never ready; its log:\n{}", gw.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_crowd_sells_every_unit_once_with_no_oversell_duplicate_or_loss() {
    init_tracing();
    let stack = Stack::start().await;
    let gw = stack
        .gateway_unready(|c| {
            // The shipped defaults for people, and an auto-ban the bots will trip.
            set(c, "limits", "per_ip", bucket(20.0, 40.0));
            set(c, "limits", "per_user", bucket(5.0, 10.0));
            set(c, "bans", "auto_ban_threshold", 50);
            set(c, "bans", "auto_ban_window_secs", 10);
            set(c, "bans", "auto_ban_ttl_secs", 60);
            set(c, "dev", "token_ttl_secs", 3600);
            // Longer than stockd can take on a loaded debug build (its Redis timeout is 3 s):
            // a deadline hit after stockd reserved tells a buyer 503 for a unit they hold.
            set(c, "upstreams", "reserve_deadline_ms", 8000);
        })
        .await;
    let Stack {
        redis: _redis,
        db,
        stockd,
        orderd: _orderd,
    } = stack;
    wait_ready(&gw).await;
    // Opens in 4 s: the crowd logs in first and waits for the server's opening time.
    let sale = create_published_activity(
        &stockd,
        &[(20, 4900), (20, 9900), (20, 14900)],
        4,
        Duration::from_secs(4),
        Duration::from_secs(3600),
    )
    .await;
    gw.wait_activity(sale.id).await;

    let out = tempfile::tempdir().expect("tempdir");
    let exe = seckill_tests::process::workspace_bin("crowd");
    let args = [
        "--gateway".to_string(),
        gw.base_url(),
        "--mysql".into(),
        db.url(),
        "--stockd".into(),
        format!("http://{}", stockd.addr),
        "--service-token".into(),
        SERVICE_TOKEN.into(),
        "--activity".into(),
        sale.id.to_string(),
        "--buyers".into(),
        "2000".into(),
        "--rate".into(),
        "1000".into(),
        "--concurrency".into(),
        "256".into(),
        "--ips".into(),
        "200".into(),
        "--abusive-ips".into(),
        "2".into(),
        "--abuse-requests".into(),
        "200".into(),
        "--drain-secs".into(),
        "60".into(),
        "--expect-sold-out".into(),
        "--quiet".into(),
        "--out".into(),
        out.path().display().to_string(),
        "--answers-tsv".into(),
        out.path().join("answers.tsv").display().to_string(),
    ];
    let run = tokio::task::spawn_blocking(move || Command::new(exe).args(args).output())
        .await
        .expect("join")
        .expect("run crowd");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}\n{stderr}");
    let report_path = out.path().join("report.json");
    assert!(
        report_path.exists(),
        "no report.json; crowd exited {:?}\n{stderr}\ngateway warnings:\n{}",
        run.status,
        warnings(&gw.log())
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert!(out.path().join("report.html").exists());
    assert!(stdout.contains("report.json: ") && stdout.contains("report.html: "));

    assert_eq!(r["oversold"], 0, "{stdout}");
    assert_eq!(r["duplicates"], 0, "{stdout}");
    assert_eq!(r["lost"], 0, "{stdout}");
    let items = r["items"].as_array().expect("items");
    assert_eq!(items.len(), 3);
    for i in items {
        assert_eq!(i["sold"], i["stock"], "every unit sold: {i}\n{stdout}");
        assert_eq!(i["stock"], 20);
    }
    let answers = r["answers"].as_object().expect("answers");
    let total: u64 = answers.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total, r["requests"].as_u64().unwrap(), "answers add up");
    assert!(
        answers["reserved"].as_u64().unwrap() >= 60,
        "at least one 202 per unit: {stdout}"
    );
    assert!(
        answers["sold_out"].as_u64().unwrap() > 0,
        "losers hear sold out"
    );
    assert!(
        answers["limited"].as_u64().unwrap() + answers["banned"].as_u64().unwrap() > 0,
        "the abusive IPs are refused"
    );
    assert_eq!(r["passed"], true, "{stdout}");
    assert!(run.status.success(), "crowd exit {:?}", run.status);

    // --answers-tsv: every answer counted in the report, one line each, in send order,
    // and burst.sh's table of the opening reads it.
    let tsv = std::fs::read_to_string(out.path().join("answers.tsv")).expect("answers.tsv");
    let lines: Vec<Vec<&str>> = tsv.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len() as u64, r["requests"].as_u64().unwrap());
    let mut last_sent = f64::MIN;
    let mut by_kind = std::collections::BTreeMap::<&str, u64>::new();
    for l in &lines {
        assert_eq!(l.len(), 3, "{l:?}");
        let (sent, latency): (f64, f64) = (l[0].parse().unwrap(), l[1].parse().unwrap());
        assert!(sent >= last_sent && latency >= 0.0, "{l:?}");
        last_sent = sent;
        *by_kind.entry(l[2]).or_default() += 1;
    }
    for (kind, n) in answers {
        assert_eq!(
            by_kind.get(kind.as_str()).copied().unwrap_or(0),
            n.as_u64().unwrap(),
            "{kind}"
        );
    }
    let table = Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/bench/opening.py"))
        .arg(out.path().join("answers.tsv"))
        .output()
        .expect("run opening.py");
    let text = String::from_utf8_lossy(&table.stdout);
    // The slice table, then the reserved answers split at the sell-out (this crowd sells
    // out, so there is a first sold_out answer to split at).
    assert!(
        table.status.success()
            && text.contains("res p50")
            && text.contains("before the sell-out")
            && text.contains("the sell-out "),
        "{text}"
    );
}

/// The last 40 WARN/ERROR lines of a log.
fn warnings(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
