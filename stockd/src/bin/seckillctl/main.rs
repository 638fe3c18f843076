//! `seckillctl`: the shell face of stockd's AdminService (and, through `dlq`, of
//! orderd's dead letters). `--json` prints one JSON document per command for
//! scripts. Errors exit non-zero with one line on stderr. Reference:
//! `docs/seckillctl.md`.

mod activity_file;
mod dlq;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::json;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use seckill_proto::auth::AttachToken;
use seckill_proto::pb;
use seckill_proto::pb::admin_service_client::AdminServiceClient;

/// Admin CLI of the seckill platform.
#[derive(Debug, Parser)]
#[command(name = "seckillctl", version)]
struct Cli {
    /// stockd gRPC address.
    #[arg(long, global = true, default_value = "http://127.0.0.1:50051")]
    stockd: String,
    /// orderd gRPC address.
    #[arg(long, global = true, default_value = "http://127.0.0.1:50052")]
    orderd: String,
    /// Service token sent as `authorization: Bearer <token>`.
    #[arg(
        long,
        global = true,
        env = "SECKILL_SERVICE_TOKEN",
        default_value = "local-dev-service-token",
        hide_env_values = true
    )]
    token: String,
    /// Print JSON (one document) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// PEM CA certificate(s) that verify the daemons; needed for `https://` addresses.
    #[arg(long, global = true, env = "SECKILLCTL_TLS_CA", default_value = "")]
    tls_ca: String,
    /// PEM client certificate chain, for daemons with `[grpc.tls] client_ca_path`.
    #[arg(long, global = true, env = "SECKILLCTL_TLS_CERT", default_value = "")]
    tls_cert: String,
    /// PEM private key of `--tls-cert`.
    #[arg(long, global = true, env = "SECKILLCTL_TLS_KEY", default_value = "")]
    tls_key: String,
    /// Name to verify the daemons' certificates against (default: the address's host).
    #[arg(long, global = true, default_value = "")]
    tls_domain: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Activities: create, get, list, publish, status.
    #[command(subcommand)]
    Activity(ActivityCmd),
    /// Per item: total = Redis remaining + in flight + active orders.
    Reconcile {
        /// Activity id.
        id: u64,
        /// Only this item.
        #[arg(long)]
        item: Option<u64>,
        /// Rebuild Redis from MySQL when nothing is in flight.
        #[arg(long)]
        repair: bool,
    },
    /// Ban an IP or CIDR at every edge.
    Ban {
        cidr: String,
        /// Seconds until the ban lapses; 0 = until unbanned.
        #[arg(long, default_value_t = 0)]
        ttl_secs: u64,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Lift a ban.
    Unban { cidr: String },
    /// List current bans.
    Bans,
    /// Dead letters (orderd).
    #[command(subcommand)]
    Dlq(dlq::DlqCmd),
}

#[derive(Debug, Subcommand)]
enum ActivityCmd {
    /// Create an activity from a TOML file (see deploy/local/activity.toml).
    Create {
        #[arg(long)]
        file: PathBuf,
        /// Publish it right after creating it.
        #[arg(long)]
        publish: bool,
    },
    /// Show one activity.
    Get { id: u64 },
    /// List activities.
    List {
        /// Only activities whose window has not ended.
        #[arg(long)]
        current: bool,
    },
    /// Warm Redis now, or schedule it with --at.
    Publish {
        id: u64,
        /// RFC 3339 time or now+N{s,m,h,d}.
        #[arg(long)]
        at: Option<String>,
    },
    /// Stock per item and shard.
    Status { id: u64 },
}

type Admin = AdminServiceClient<InterceptedService<Channel, AttachToken>>;

/// How `https://` addresses are dialled (the `--tls-*` flags).
fn client_tls(cli: &Cli) -> seckill_daemon::tls::ClientTls {
    seckill_daemon::tls::ClientTls {
        ca_path: cli.tls_ca.clone(),
        cert_path: cli.tls_cert.clone(),
        key_path: cli.tls_key.clone(),
        domain: cli.tls_domain.clone(),
    }
}

/// The flag of a field of the section `tls` ([`client_tls`]): `tls.ca_path` is `--tls-ca`.
fn flag(field: &str) -> String {
    format!(
        "--{}",
        field.trim_end_matches("_path").replace(['.', '_'], "-")
    )
}

/// A channel to `addr` (`host:port` means `http://host:port`); `https://` over TLS with
/// `tls`. Calls time out after `timeout`.
pub(crate) async fn channel(
    addr: &str,
    tls: &seckill_daemon::tls::ClientTls,
    timeout: Duration,
) -> anyhow::Result<Channel> {
    let addr = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let mut endpoint =
        Endpoint::from_shared(addr.clone()).with_context(|| format!("bad address `{addr}`"))?;
    if addr.starts_with("https://") {
        let config = tls
            .load("tls")
            .map_err(|e| anyhow::anyhow!("{}: {}", flag(&e.field), e.problem))?;
        endpoint = endpoint.tls_config(config)?;
    }
    endpoint
        .connect_timeout(Duration::from_secs(3))
        .timeout(timeout)
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))
}

async fn admin(cli: &Cli) -> anyhow::Result<Admin> {
    let token =
        AttachToken::new(&cli.token).map_err(|s| anyhow::anyhow!("--token: {}", s.message()))?;
    Ok(AdminServiceClient::with_interceptor(
        channel(&cli.stockd, &client_tls(cli), Duration::from_secs(30)).await?,
        token,
    ))
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json_out = cli.json;
    match &cli.cmd {
        Cmd::Activity(cmd) => {
            // Read local input before connecting, so a bad file fails fast.
            let create = match cmd {
                ActivityCmd::Create { file, .. } => Some(
                    activity_file::ActivityFile::load(file)?
                        .to_request(seckill_lua::clock::now_ms())
                        .with_context(|| file.display().to_string())?,
                ),
                _ => None,
            };
            let publish_at = match cmd {
                ActivityCmd::Publish { at: Some(at), .. } => {
                    activity_file::parse_time("--at", at, seckill_lua::clock::now_ms())?
                }
                _ => 0,
            };
            let mut c = admin(&cli).await?;
            match cmd {
                ActivityCmd::Create { publish, .. } => {
                    let req = create.expect("parsed above");
                    let mut a = c
                        .create_activity(req)
                        .await
                        .map_err(status_err)?
                        .into_inner();
                    if *publish {
                        a = c
                            .publish_activity(pb::PublishActivityRequest {
                                activity_id: a.id,
                                publish_at_ms: 0,
                            })
                            .await
                            .map_err(status_err)?
                            .into_inner()
                            .activity
                            .unwrap_or(a);
                    }
                    output::print(json_out, output::activity(&a), output::activity_text(&a));
                }
                ActivityCmd::Get { id } => {
                    let a = c
                        .get_activity(pb::GetActivityRequest { activity_id: *id })
                        .await
                        .map_err(status_err)?
                        .into_inner();
                    output::print(json_out, output::activity(&a), output::activity_text(&a));
                }
                ActivityCmd::List { current } => {
                    let list = c
                        .list_activities(pb::ListActivitiesRequest {
                            current_only: *current,
                        })
                        .await
                        .map_err(status_err)?
                        .into_inner()
                        .activities;
                    let value = json!(list.iter().map(output::activity).collect::<Vec<_>>());
                    let text = list
                        .iter()
                        .map(output::activity_text)
                        .collect::<Vec<_>>()
                        .join("\n");
                    output::print(json_out, value, text);
                }
                ActivityCmd::Publish { id, .. } => {
                    let r = c
                        .publish_activity(pb::PublishActivityRequest {
                            activity_id: *id,
                            publish_at_ms: publish_at,
                        })
                        .await
                        .map_err(status_err)?
                        .into_inner();
                    let a = r.activity.unwrap_or_default();
                    let mut value = output::activity(&a);
                    value["warmed"] = json!(r.warmed);
                    let text = format!("{}\nwarmed: {}", output::activity_text(&a), r.warmed);
                    output::print(json_out, value, text);
                }
                ActivityCmd::Status { id } => {
                    let r = c
                        .get_activity_status(pb::GetActivityStatusRequest { activity_id: *id })
                        .await
                        .map_err(status_err)?
                        .into_inner();
                    let a = r.activity.unwrap_or_default();
                    let value = json!({
                        "activity": output::activity(&a),
                        "items": r.items.iter().map(output::item_status).collect::<Vec<_>>(),
                    });
                    let mut text = output::activity_text(&a);
                    for i in &r.items {
                        text.push('\n');
                        text.push_str(&output::item_status_text(i));
                    }
                    output::print(json_out, value, text);
                }
            }
        }
        Cmd::Reconcile { id, item, repair } => {
            let r = admin(&cli)
                .await?
                .reconcile(pb::ReconcileRequest {
                    activity_id: *id,
                    item_id: item.unwrap_or(0),
                    repair: *repair,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            let value = json!(r
                .items
                .iter()
                .map(output::reconciliation)
                .collect::<Vec<_>>());
            let text = r
                .items
                .iter()
                .map(output::reconciliation_text)
                .collect::<Vec<_>>()
                .join("\n");
            output::print(json_out, value, text);
            if r.items.iter().any(|i| !i.consistent) {
                bail!("inconsistent items found");
            }
        }
        Cmd::Ban {
            cidr,
            ttl_secs,
            reason,
        } => {
            admin(&cli)
                .await?
                .ban_ip(pb::BanIpRequest {
                    cidr: cidr.clone(),
                    ttl_secs: *ttl_secs,
                    reason: reason.clone(),
                })
                .await
                .map_err(status_err)?;
            output::print(
                json_out,
                json!({"banned": cidr, "ttl_secs": ttl_secs}),
                format!("banned {cidr}"),
            );
        }
        Cmd::Unban { cidr } => {
            let removed = admin(&cli)
                .await?
                .unban_ip(pb::UnbanIpRequest { cidr: cidr.clone() })
                .await
                .map_err(status_err)?
                .into_inner()
                .removed;
            output::print(
                json_out,
                json!({"unbanned": cidr, "removed": removed}),
                if removed {
                    format!("unbanned {cidr}")
                } else {
                    format!("{cidr} was not banned")
                },
            );
        }
        Cmd::Bans => {
            let bans = admin(&cli)
                .await?
                .list_bans(pb::ListBansRequest {})
                .await
                .map_err(status_err)?
                .into_inner()
                .bans;
            let value = json!(bans.iter().map(output::ban).collect::<Vec<_>>());
            let text = bans
                .iter()
                .map(output::ban_text)
                .collect::<Vec<_>>()
                .join("\n");
            output::print(json_out, value, text);
        }
        Cmd::Dlq(_) => {
            let tls = client_tls(&cli);
            let channel = channel(&cli.orderd, &tls, Duration::from_secs(120))
                .await
                .context("orderd")?;
            let Cmd::Dlq(cmd) = cli.cmd else {
                unreachable!()
            };
            return dlq::run(cmd, channel, &cli.token, json_out).await;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("seckillctl: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seckillctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
