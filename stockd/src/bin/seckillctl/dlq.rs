//! `seckillctl dlq ...`: the dead letters kept by orderd (stream entries that failed
//! more than `consumer.max_deliveries` times), through OrderService.ListDeadLetters
//! and OrderService.ReplayDeadLetters.
//!
//! - `dlq list [--all]`: the letters not yet replayed (`--all`: replayed ones too).
//! - `dlq replay [IDS...]`: re-process them (no ids: every letter not yet replayed).
//!   Idempotent by order id: a letter whose order already exists is only marked
//!   replayed. Exits non-zero when any letter failed again.

use seckill_proto::auth::AttachToken;
use seckill_proto::pb;
use seckill_proto::pb::order_service_client::OrderServiceClient;
use serde_json::json;
use tonic::transport::Channel;

/// `seckillctl dlq` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DlqCmd {
    /// Dead letters not yet replayed (`--all`: replayed ones too).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Replays dead letters by id (none given: every one not yet replayed).
    Replay { ids: Vec<u64> },
}

fn ms_text(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", s.code(), s.message())
}

/// Runs a `dlq` subcommand against orderd over `channel`.
pub async fn run(cmd: DlqCmd, channel: Channel, token: &str, json: bool) -> anyhow::Result<()> {
    let token = AttachToken::new(token).map_err(|s| anyhow::anyhow!("--token: {}", s.message()))?;
    let mut client = OrderServiceClient::with_interceptor(channel, token);
    match cmd {
        DlqCmd::List { all } => {
            let out = client
                .list_dead_letters(pb::ListDeadLettersRequest {
                    limit: 1000,
                    include_replayed: all,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            if json {
                let letters: Vec<_> = out
                    .dead_letters
                    .iter()
                    .map(|d| {
                        json!({
                            "id": d.id,
                            "stream": d.stream,
                            "entry_id": d.entry_id,
                            "reservation_id": d.reservation_id,
                            "payload": serde_json::from_str::<serde_json::Value>(&d.payload)
                                .unwrap_or_else(|_| json!(d.payload)),
                            "deliveries": d.deliveries,
                            "last_error": d.last_error,
                            "created_at_ms": d.created_at_ms,
                            "replayed_at_ms": d.replayed_at_ms,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"dead_letters": letters, "total_unreplayed": out.total_unreplayed})
                );
            } else {
                println!("{} dead letter(s) not yet replayed", out.total_unreplayed);
                for d in &out.dead_letters {
                    println!(
                        "#{} {} {} rid={} deliveries={} at {} replayed {}\n    error: {}\n    payload: {}",
                        d.id,
                        d.stream,
                        d.entry_id,
                        if d.reservation_id.is_empty() { "-" } else { &d.reservation_id },
                        d.deliveries,
                        ms_text(d.created_at_ms),
                        ms_text(d.replayed_at_ms),
                        d.last_error,
                        d.payload
                    );
                }
            }
            Ok(())
        }
        DlqCmd::Replay { ids } => {
            let out = client
                .replay_dead_letters(pb::ReplayDeadLettersRequest { ids })
                .await
                .map_err(status_err)?
                .into_inner();
            if json {
                println!(
                    "{}",
                    json!({"replayed": out.replayed, "failed": out.failed, "errors": out.errors})
                );
            } else {
                println!("replayed {}, failed {}", out.replayed, out.failed);
                for e in &out.errors {
                    println!("  {e}");
                }
            }
            if out.failed > 0 {
                anyhow::bail!("{} dead letter(s) could not be replayed", out.failed);
            }
            Ok(())
        }
    }
}
