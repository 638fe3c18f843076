//! `gateway`: flags, config, tracing, then [`gateway::run`].
//!
//! `-c PATH` config (default `deploy/local/gateway.toml`), `-t` validate and exit,
//! `-u` take over from a running gateway (graceful upgrade), `-d` daemonize.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "gateway", about = "seckill edge gateway (pingora)")]
struct Flags {
    /// Config file (TOML).
    #[arg(
        short = 'c',
        long = "config",
        default_value = "deploy/local/gateway.toml"
    )]
    config: PathBuf,
    /// Validate the config and exit (non-zero with the problem on error).
    #[arg(short = 't', long = "test")]
    test: bool,
    /// Graceful upgrade: take the listening sockets over from the running gateway
    /// (send it SIGQUIT).
    #[arg(short = 'u', long = "upgrade")]
    upgrade: bool,
    /// Run in the background.
    #[arg(short = 'd', long = "daemon")]
    daemon: bool,
}

fn main() {
    let flags = Flags::parse();
    let loaded = seckill_daemon::config::load_table::<gateway::config::Config>(
        &flags.config,
        gateway::config::ENV_PREFIX,
    );
    let (config, table) = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    if flags.test {
        println!("{}: ok", flags.config.display());
        return;
    }
    // No writer thread yet: `run`'s "log writer" service starts it, after the fork and
    // the bootstrap (why: there). Held to the end: dropping it writes what is queued.
    let log = seckill_daemon::telemetry::init(config.log.json, config.log.level.as_deref(), false);
    let opts = gateway::RunOpts {
        config_path: flags.config,
        config_table: table,
        upgrade: flags.upgrade,
        daemon: flags.daemon,
    };
    let ran = gateway::run(config, opts);
    if ran.is_ok() {
        // The last line of a clean stop; dropping the guard writes it and any still queued.
        tracing::info!("gateway stopped");
    }
    drop(log);
    if let Err(e) = ran {
        eprintln!("gateway: {e:#}");
        std::process::exit(1);
    }
}
