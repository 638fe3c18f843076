//! `deploy/systemd/gateway.service` run the way systemd runs it, without systemd: its
//! `ExecStartPre`, `ExecStart` (a daemonizing gateway that writes the unit's `PIDFile`)
//! and its `ExecReload` sequence, command by command, with the unit's environment and
//! `$MAINPID` read from the pid file. The reload is a graceful upgrade: a new process
//! serves, the old one exits, and no request is refused meanwhile; a reload with a broken
//! file stops at its first command and the running gateway keeps serving. Needs
//! `cargo build -p gateway --bins`.
#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seckill_tests::gateway::{base_config, set, Stack};
use seckill_tests::process::{free_port, wait_until_async, workspace_bin, ChildGuard};

/// The unit's `Key=value` lines, in order.
fn unit() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/gateway.service");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn values(unit: &[(String, String)], key: &str) -> Vec<String> {
    unit.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True when process `pid` runs a thread named `log-writer` (the log writer of
/// `seckill_daemon::telemetry`; a daemonized gateway must start it after the fork).
fn has_log_writer(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "log-writer")
        })
}

/// The unit's world moved into a temporary directory: `/run/seckill-gateway` and
/// `/etc/seckill/gateway.toml` there, `/usr/local/bin/gateway` the built binary.
struct Host {
    dir: tempfile::TempDir,
    unit: Vec<(String, String)>,
}

impl Host {
    fn path(&self, unit_path: &str) -> String {
        let d = self.dir.path().display();
        unit_path
            .replace("/run/seckill-gateway", &format!("{d}/run"))
            .replace("/etc/seckill/gateway.toml", &format!("{d}/gateway.toml"))
            .replace(
                "/usr/local/bin/gateway",
                &workspace_bin("gateway").display().to_string(),
            )
    }

    fn pid_file(&self) -> PathBuf {
        PathBuf::from(self.path(&values(&self.unit, "PIDFile")[0]))
    }

    /// `$MAINPID`: what systemd reads from `PIDFile=`.
    fn main_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file())
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Runs one `Exec*=` line as systemd would (after `$MAINPID` substitution); returns
    /// whether it succeeded. Output goes to `systemd.log`.
    fn exec(&self, line: &str) -> bool {
        let line = self.path(line).replace(
            "$MAINPID",
            &self.main_pid().map(|p| p.to_string()).unwrap_or_default(),
        );
        let mut words = line.split_whitespace();
        let mut cmd = Command::new(words.next().unwrap());
        cmd.args(words);
        for kv in values(&self.unit, "Environment") {
            let (k, v) = kv.split_once('=').unwrap();
            cmd.env(k, self.path(v));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("systemd.log"))
            .unwrap();
        cmd.stdout(log.try_clone().unwrap()).stderr(log);
        cmd.status().expect(&line).success()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("systemd.log")).unwrap_or_default()
    }
}

impl Drop for Host {
    /// The daemonized gateways are nobody's children: stop every one this test started.
    fn drop(&mut self) {
        let run = self.dir.path().join("run");
        for name in ["gateway.pid", "gateway.pid.old"] {
            if let Ok(pid) = std::fs::read_to_string(run.join(name)) {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_units_reload_is_a_graceful_upgrade_and_a_bad_file_stops_it_first() {
    let s = Stack::start().await;
    let host = Host {
        dir: tempfile::tempdir().unwrap(),
        unit: unit(),
    };
    // RuntimeDirectory= makes this; systemd would create it before ExecStartPre.
    std::fs::create_dir(host.dir.path().join("run")).unwrap();
    let (port, admin_port) = (free_port(None), free_port(None));
    let orderd = s.orderd.addr_str();
    let mut config = base_config(
        &s.redis,
        &s.stockd.addr,
        &orderd,
        port,
        admin_port,
        host.dir.path(),
    );
    // Requests accepted in the hand-over's last instant get a second to finish.
    set(&mut config, "server", "grace_period_secs", 1);
    let config_path = host.dir.path().join("gateway.toml");
    std::fs::write(&config_path, config.to_string()).unwrap();

    // Start: ExecStartPre, then ExecStart daemonizes and writes the pid file.
    for line in values(&host.unit, "ExecStartPre") {
        assert!(host.exec(&line), "{line}: {}", host.log());
    }
    assert!(
        host.exec(&values(&host.unit, "ExecStart")[0]),
        "{}",
        host.log()
    );
    let url = format!("http://127.0.0.1:{port}/api/v1/activities");
    wait_until_async(
        "the daemonized gateway to serve",
        Duration::from_secs(30),
        || async { matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) },
    )
    .await;
    let first = host.main_pid().expect("ExecStart wrote the pid file");
    assert!(alive(first));
    // pingora starts each service on its own thread: the listeners may serve before the
    // "log writer" service has started its thread, so wait for it (bounded).
    wait_until_async(
        "the daemonized gateway's log-writer thread",
        Duration::from_secs(10),
        || async { has_log_writer(first) },
    )
    .await;

    // Clients on fresh connections all through the reload.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, ok, failed, url) = (stop.clone(), ok.clone(), failed.clone(), url.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match http.get(&url).send().await {
                    Ok(r) if r.status() == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        errors.push(format!("{other:?}"));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
            errors
        })
    };
    wait_until_async(
        "requests before the reload",
        Duration::from_secs(10),
        || async { ok.load(Ordering::Relaxed) > 20 },
    )
    .await;

    // Reload: every ExecReload line in order, as `systemctl reload` runs them.
    for line in values(&host.unit, "ExecReload") {
        assert!(host.exec(&line), "{line}: {}", host.log());
    }
    wait_until_async(
        "a new main process and the old one gone",
        Duration::from_secs(30),
        || async { host.main_pid().is_some_and(|p| p != first && alive(p)) && !alive(first) },
    )
    .await;
    let upgraded = host.main_pid().unwrap();
    wait_until_async(
        "the upgraded (`-u -d`) gateway's log-writer thread",
        Duration::from_secs(10),
        || async { has_log_writer(upgraded) },
    )
    .await;
    let served_before = ok.load(Ordering::Relaxed);
    wait_until_async(
        "requests after the upgrade",
        Duration::from_secs(10),
        || async { ok.load(Ordering::Relaxed) > served_before + 20 },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let errors = load.await.unwrap();
    assert!(
        errors.is_empty(),
        "{} requests failed during the upgrade: {errors:?}\n{}",
        failed.load(Ordering::Relaxed),
        host.log()
    );

    // A broken file: the reload stops at its first line (`-t`), nothing is signalled.
    let second = host.main_pid().unwrap();
    std::fs::write(&config_path, "[server\n").unwrap();
    let reload = values(&host.unit, "ExecReload");
    assert!(!host.exec(&reload[0]), "`-t` accepted a broken file");
    assert!(alive(second));
    let r = reqwest::get(&url).await.expect("still serving");
    assert_eq!(r.status(), 200);
    assert_eq!(host.main_pid(), Some(second));
}

/// A takeover (`gateway -u`) with no running gateway to hand the sockets over fails in
/// pingora's bootstrap, which ends the process itself (`exit(1)`, after about five
/// seconds of retries) right after logging why. That line is what the operator reads,
/// so it must be in the log: the log writer thread starts only once the services run,
/// and until then each line is written by the thread that logs it (a line queued for a
/// writer thread would die with the process: the old start-up lost the line whenever
/// the writer lost its race with `exit`, every time in the runs that checked it).
#[test]
fn a_failed_takeover_exits_non_zero_and_its_last_line_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/gateway.toml");
    let log_path = dir.path().join("gateway.log");
    let mut cmd = Command::new(workspace_bin("gateway"));
    cmd.arg("-u")
        .arg("-c")
        .arg(&config)
        .env(
            "GATEWAY__SERVER__UPGRADE_SOCK",
            dir.path().join("nobody.sock"),
        )
        .env("GATEWAY__SERVER__PID_FILE", dir.path().join("gateway.pid"))
        .env("RUST_LOG", "info");
    let mut gateway = ChildGuard::spawn("gateway -u", cmd, &log_path).expect("run gateway -u");
    // pingora retries the hand-over for about five seconds; a gateway that got sockets
    // from somewhere would serve forever instead (killed when the guard drops).
    let status = gateway.wait_exit(Duration::from_secs(60));
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("gateway -u did not exit within 60 s:\n{log}"));
    assert_eq!(status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("Bootstrap failed"),
        "the log's last line should say why the takeover failed: {last:?}\n{log}"
    );
}
