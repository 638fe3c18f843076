//! `crowd`: drives a simulated flash-sale crowd through the edge over HTTP, then checks
//! the outcome against MySQL and stockd's Reconcile and writes the report.
//!
//! Phases: find the activity on the edge → log every buyer in (`POST /api/v1/dev/token`)
//! → wait for the server's opening time → buyers arrive at `--rate` per second (retries,
//! double clicks, resent requests) while a few abusive IPs hammer → wait for the drain →
//! pay a share of the orders → gather facts, judge, write `report.json` and
//! `report.html`, print the report and both paths. Exits 1 when a check fails, 2 when the
//! run could not be made.
//!
//! Layout: `http` (doors = client addresses, one call = one answer), `driver` (the crowd),
//! `stats` (answer kinds, latency, throughput), `verify` (drain, facts, checks),
//! `report` (JSON, HTML, terminal).

mod driver;
mod http;
mod report;
mod stats;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use crate::http::Source;

#[derive(Debug, Parser)]
#[command(
    name = "crowd",
    about = "Drive a simulated flash-sale crowd through the edge over HTTP, check the outcome, write report.json and report.html"
)]
struct Args {
    /// Base URL of the gateway.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    gateway: String,
    /// MySQL (MariaDB) URL of the record, for the checks.
    #[arg(
        long,
        env = "SECKILL_MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306/seckill"
    )]
    mysql: String,
    /// stockd gRPC address, for AdminService.Reconcile.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    stockd: String,
    /// Service token for stockd's admin API.
    #[arg(
        long,
        env = "SECKILL_SERVICE_TOKEN",
        default_value = "local-dev-service-token"
    )]
    service_token: String,
    /// Activity id; default: the open activity, else the next upcoming one.
    #[arg(long)]
    activity: Option<u64>,
    /// Item ids to buy (comma-separated); default: every item of the activity.
    #[arg(long, value_delimiter = ',')]
    items: Vec<u64>,
    /// Number of buyers (distinct users).
    #[arg(short = 'n', long, default_value_t = 50_000)]
    buyers: u64,
    /// Arrivals per second; default: buyers / duration.
    #[arg(long)]
    rate: Option<f64>,
    /// Seconds over which the buyers arrive (when --rate is not given).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Buyers in flight at most.
    #[arg(long, default_value_t = 512)]
    concurrency: usize,
    /// Retries per buyer after 429/503/transport errors (same request id).
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Longest pause before a retry, ms (Retry-After is honoured up to this).
    #[arg(long, default_value_t = 1_000)]
    retry_max_wait_ms: u64,
    /// Fraction of buyers who click twice.
    #[arg(long, default_value_t = 0.05)]
    double_click: f64,
    /// Fraction of buyers who resend the same request after a "lost" answer.
    #[arg(long, default_value_t = 0.02)]
    lost_response: f64,
    /// Abusive IPs hammering the reserve route, ignoring Retry-After.
    #[arg(long, default_value_t = 3)]
    abusive_ips: u32,
    /// Requests per abusive IP (enough to cross the gateway's auto-ban threshold).
    #[arg(long, default_value_t = 1_000)]
    abuse_requests: u32,
    /// How distinct client addresses reach the edge: bind (127.x.y.z source addresses),
    /// xff (X-Forwarded-For from 127.0.0.1; needs it in the gateway's trusted proxies), none.
    #[arg(long, value_enum, default_value = "bind")]
    source: Source,
    /// Distinct buyer addresses.
    #[arg(long, default_value_t = 1_000)]
    ips: u32,
    /// Fraction of orders paid through the edge after the drain.
    #[arg(long, default_value_t = 0.5)]
    pay: f64,
    /// Longest wait for the drain (every reservation an order), seconds.
    #[arg(long, default_value_t = 120)]
    drain_secs: u64,
    /// Fail unless every unit is sold (demand ≥ stock, no faults).
    #[arg(long)]
    expect_sold_out: bool,
    /// Output directory for report.json and report.html.
    #[arg(short = 'o', long, default_value = ".")]
    out: PathBuf,
    /// User ids are `<prefix>-<n>`; default: `buyer-<random>` so runs never collide.
    #[arg(long)]
    user_prefix: Option<String>,
    /// Seed of the crowd's choices (items, double clicks, jitter).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// No progress bar (progress lines every 5 s instead).
    #[arg(long)]
    quiet: bool,
    /// Also write every answer of the buy path to this file, one line each:
    /// `sent_ms<TAB>latency_ms<TAB>kind`, sent measured from the opening (how the
    /// opening's first hundreds of milliseconds went; `deploy/bench/burst.sh` tables it).
    #[arg(long, env = "CROWD_ANSWERS_TSV")]
    answers_tsv: Option<PathBuf>,
}

fn bar(quiet: bool, len: u64, template: &str) -> ProgressBar {
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(len)
    };
    pb.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let gateway = args.gateway.trim_end_matches('/').to_owned();
    if args.buyers == 0 {
        bail!("--buyers: must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.double_click)
        || !(0.0..=1.0).contains(&args.lost_response)
        || !(0.0..=1.0).contains(&args.pay)
    {
        bail!("--double-click, --lost-response and --pay are fractions in 0..=1");
    }
    let rate = match args.rate {
        Some(r) if r > 0.0 => r,
        Some(_) => bail!("--rate: must be > 0"),
        None if args.duration > 0.0 => args.buyers as f64 / args.duration,
        None => bail!("--duration: must be > 0"),
    };
    let ips = match args.source {
        Source::Bind => {
            let fit = http::doors_that_fit(args.ips, args.concurrency, http::open_files_limit());
            if fit < args.ips {
                eprintln!(
                    "crowd: {} buyer addresses instead of {} to stay under the open-files limit (raise it with `ulimit -n`)",
                    fit, args.ips
                );
            }
            fit
        }
        _ => args.ips,
    };
    let doors = http::doors(&gateway, args.source, ips, false, args.concurrency)
        .context("preparing buyer addresses")?;
    let bot_doors = http::doors(&gateway, args.source, args.abusive_ips, true, 8)?;
    let mut act = http::discover(&doors[0], &gateway, args.activity).await?;
    let items: Vec<u64> = if args.items.is_empty() {
        act.items.iter().map(|i| i.id).collect()
    } else {
        for i in &args.items {
            if !act.items.iter().any(|x| x.id == *i) {
                bail!("--items: item {i} is not in activity {}", act.id);
            }
        }
        args.items.clone()
    };
    if items.is_empty() {
        bail!("activity {} has no items", act.id);
    }
    act.items.retain(|i| items.contains(&i.id));
    let stock: u64 = act.items.iter().map(|i| i.stock).sum();
    eprintln!(
        "crowd: activity {} \"{}\", items {:?} ({} units), {} buyers at {:.0}/s; opens in {:.1} s",
        act.id,
        act.title,
        items,
        stock,
        args.buyers,
        rate,
        ((act.start_at_ms - (http::now_ms() + act.skew_ms)) as f64 / 1000.0).max(0.0)
    );

    // Fail fast on MySQL/stockd before the crowd, not after it.
    let src =
        verify::Sources::connect(&args.mysql, &args.stockd, &args.service_token, act.id).await?;

    let prefix = args
        .user_prefix
        .clone()
        .unwrap_or_else(|| format!("buyer-{:x}", rand::random::<u32>()));
    let users: Vec<String> = (0..args.buyers).map(|i| format!("{prefix}-{i}")).collect();
    let pb = bar(
        args.quiet,
        users.len() as u64,
        "{spinner} login [{elapsed_precise}] {bar:30} {pos}/{len} · {per_sec}",
    );
    let (jwts, mut login_requests, mut login_failures) =
        driver::login_all(&doors, &gateway, &users, args.concurrency, &pb).await;
    pb.finish();
    let bot_users: Vec<String> = (0..args.abusive_ips)
        .map(|k| format!("{prefix}-bot-{k}"))
        .collect();
    let (bot_jwts, r, f) =
        driver::login_all(&bot_doors, &gateway, &bot_users, 4, &ProgressBar::hidden()).await;
    login_requests += r;
    login_failures += f;
    // login_all counts the logins it could not make: here, the bots'.
    let bots_without_login = f;
    if jwts.iter().all(Option::is_none) {
        bail!("no buyer could log in through POST {gateway}/api/v1/dev/token (is dev.enabled set in the gateway config?)");
    }
    let bots: Vec<driver::Bot> = bot_doors
        .into_iter()
        .take(args.abusive_ips as usize)
        .zip(bot_users)
        .zip(bot_jwts)
        .map(|((door, user), jwt)| driver::Bot { door, user, jwt })
        .collect();

    let plan = driver::Plan {
        gateway: gateway.clone(),
        rate,
        concurrency: args.concurrency,
        retries: args.retries,
        retry_max_wait_ms: args.retry_max_wait_ms,
        double_click: args.double_click,
        lost_response: args.lost_response,
        abuse_requests: args.abuse_requests,
        items,
        seed: args.seed,
        keep_answers: args.answers_tsv.is_some(),
    };
    // Created now, so a path that cannot be written fails before the run, not after.
    let answers_file = match &args.answers_tsv {
        Some(p) => Some(
            std::fs::File::create(p)
                .with_context(|| format!("--answers-tsv {}: cannot create", p.display()))?,
        ),
        None => None,
    };
    let started_at_ms = http::now_ms();
    let pb = bar(
        args.quiet,
        users.len() as u64,
        "{spinner} waiting for the opening",
    );
    let mut crowd = driver::run(plan, act.clone(), &doors, &users, jwts.clone(), bots, pb).await;
    crowd.login_requests = login_requests;
    crowd.login_failures = login_failures;
    if let (Some(f), Some(p)) = (answers_file, &args.answers_tsv) {
        write_answers(f, crowd.stats.each_answer())
            .with_context(|| format!("--answers-tsv {}: cannot write", p.display()))?;
    }

    let reserved_ids = crowd.reserved.keys().cloned().collect();
    let pb = bar(args.quiet, 0, "{spinner} {msg}");
    let (drain_time, drained) = verify::drain(
        &src,
        &reserved_ids,
        Duration::from_secs(args.drain_secs),
        &pb,
    )
    .await;
    pb.finish_and_clear();
    let (paid, refused) = verify::pay_some(&src, &gateway, &crowd.reserved, args.pay).await;

    // Orders no 202 named: can their buyers see them, as an app's "my orders" would?
    let index: std::collections::HashMap<&str, usize> = users
        .iter()
        .enumerate()
        .map(|(i, u)| (u.as_str(), i))
        .collect();
    let visible = verify::find_unacknowledged(&src, &gateway, &reserved_ids, |user| {
        let i = *index.get(user)?;
        Some((jwts[i].clone()?, doors[i % doors.len()].clone()))
    })
    .await;

    let mut facts = verify::Facts {
        unacknowledged_visible: Some(visible),
        client_duplicates: crowd.client_duplicates.clone(),
        idempotency_violations: crowd.idempotency_violations,
        reserved: reserved_ids,
        expect_sold_out: args.expect_sold_out,
        ..verify::Facts::default()
    };
    verify::gather(&src, &mut facts).await?;
    let verdict = verify::evaluate(&facts);
    let run = report::RunInfo {
        gateway,
        activity_id: act.id,
        activity_title: act.title.clone(),
        buyers: args.buyers,
        rate_per_sec: rate,
        concurrency: args.concurrency,
        abusive_ips: args.abusive_ips,
        source: format!("{:?}", args.source).to_lowercase(),
        started_at_ms,
        crowd_secs: crowd.elapsed.as_secs_f64(),
        drain_secs: drain_time.as_secs_f64(),
        drained,
        login_requests: crowd.login_requests,
        login_failures: crowd.login_failures,
        buyers_without_login: crowd.buyers_without_login,
        bots_without_login,
        payments_applied: paid,
        payments_refused: refused,
    };
    let rep = report::Report::new(
        run,
        &facts.items,
        &crowd.stats,
        crowd.error_samples.clone(),
        crowd.reserved.len() as u64,
        verdict,
    );

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json_path = args.out.join("report.json");
    let html_path = args.out.join("report.html");
    std::fs::write(&json_path, serde_json::to_vec_pretty(&rep)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(&html_path, rep.html())
        .with_context(|| format!("writing {}", html_path.display()))?;
    println!("{}", rep.text());
    println!("report.json: {}", abs(&json_path).display());
    println!("report.html: {}", abs(&html_path).display());
    Ok(rep.passed)
}

/// The `--answers-tsv` lines, in send order.
fn write_answers(
    f: std::fs::File,
    answers: &[(Duration, Duration, stats::Kind)],
) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut sorted: Vec<_> = answers.iter().collect();
    sorted.sort_by_key(|(sent, _, _)| *sent);
    let mut w = std::io::BufWriter::new(f);
    for (sent, latency, kind) in sorted {
        writeln!(
            w,
            "{:.3}\t{:.3}\t{}",
            sent.as_secs_f64() * 1e3,
            latency.as_secs_f64() * 1e3,
            kind.name()
        )?;
    }
    w.flush()
}

fn abs(p: &std::path::Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crowd: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("crowd: {e:#}");
            ExitCode::from(2)
        }
    }
}
