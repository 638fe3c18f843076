//! Child processes, free ports and readiness waits.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn()?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
        })
    }

    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap: the `kill -9` of fault tests.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL when it has not exited within `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(pid) = self.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
            if self.wait_exit(grace).is_none() {
                tracing::warn!(name = %self.name, "did not stop on SIGTERM; killing");
                self.kill();
            }
        }
    }

    /// Waits up to `timeout` for the process to exit on its own: its status, or `None`
    /// while it still runs (or was already reaped).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago. `also_free_plus` asks that
/// `port + also_free_plus` be free too (Redis Cluster's bus port is `port + 10000`).
pub fn free_port(also_free_plus: Option<u16>) -> u16 {
    for _ in 0..200 {
        let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)) {
            Ok(l) => l.local_addr().map(|a| a.port()).unwrap_or(0),
            Err(_) => 0,
        };
        if port == 0 {
            continue;
        }
        match also_free_plus {
            None => return port,
            Some(plus) => {
                let Some(other) = port.checked_add(plus) else {
                    continue;
                };
                if TcpListener::bind((Ipv4Addr::LOCALHOST, other)).is_ok() {
                    return port;
                }
            }
        }
    }
    panic!("no free port found on 127.0.0.1");
}

/// Polls `ready` every 20 ms until it returns true or `timeout` passes.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Async twin of [`wait_until`].
pub async fn wait_until_async<F, Fut>(what: &str, timeout: Duration, ready: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until_async_or(what, timeout, ready, String::new).await;
}

/// [`wait_until_async`] whose timeout also prints `context()` (a log, the last answer).
pub async fn wait_until_async_or<F, Fut>(
    what: &str,
    timeout: Duration,
    mut ready: F,
    context: impl Fn() -> String,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !ready().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `kill -<sig> pid`; panics when `kill` fails (no such process).
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// True when process `pid` itself holds a socket listening on TCP `port` (IPv4), read
/// from `/proc/net/tcp` and the process's descriptors: [`port_open`] also answers true
/// when another process took the port first, and a child that lost the race to bind
/// would then look ready while its callers talk to the other process.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // sl local_address rem_address st ... inode: "0100007F:1F90", state 0A = LISTEN.
    let sockets: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let inode = f.get(9)?;
            (local == port && *f.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    if sockets.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
    })
}

/// True when something accepts TCP connections on `127.0.0.1:port`.
pub fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Path of a workspace binary (`stockd`, `orderd`, `gateway`, `seckillctl`) built in
/// the same profile as the running test. `deploy/local/test.sh` builds them first.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test binary>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the binaries first (cargo build --workspace --bins)",
        bin.display()
    );
    bin
}

/// Runs a short command and returns its stdout; panics with its stderr on failure.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `start` (which panics on failure, tearing down what it began) up to 3 times.
/// For the harness's servers: a free port can be taken by a parallel test between
/// choosing it and binding it.
pub fn with_retries<T>(what: &str, mut start: impl FnMut() -> T) -> T {
    for attempt in 1..3 {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut start)) {
            Ok(v) => return v,
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("{what}: start attempt {attempt} failed, retrying: {why}");
            }
        }
    }
    start()
}

/// `<bin> -t -c <path>`, the built daemon's config test: whether it passed, and what it
/// printed (stdout, then stderr).
pub fn config_test(bin: &str, path: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(workspace_bin(bin))
        .arg("-t")
        .arg("-c")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("run {bin} -t: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_on_names_the_process_that_holds_the_port_and_no_other() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        // Open for everyone, but another process's listener.
        assert!(port_open(port));
        let mut other = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!listens_on(other.id(), port));
        let _ = other.kill();
        let _ = other.wait();
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
    }
}
