//! The `orderd` binary: the shared daemon start-up ([`seckill_daemon::start`]: `-c`, `-t`,
//! `--migrate`, tracing, listeners, SIGHUP reload) around [`orderd::run`].

use std::process::ExitCode;

/// mimalloc: fewer cycles per allocation than glibc under many threads, and the request
/// path allocates (protobuf, HTTP/2 frames, Redis frames).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    seckill_daemon::start::main(
        "orderd",
        "Order daemon of the seckill platform: orders, payment, timeouts, dead letters.",
        orderd::config::ENV_PREFIX,
        |c| seckill_daemon::start::Endpoints {
            grpc: &c.grpc.listen,
            admin: c.admin.listen.as_deref(),
            mysql_url: &c.mysql.url,
            json_logs: c.log.json,
            log_level: c.log.level.as_deref(),
            worker_threads: 0,
        },
        orderd::run,
    )
}
