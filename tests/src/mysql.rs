//! Real MariaDB for tests.
//!
//! [`MariaDb`] is a `mariadbd` of the test's own: a fresh data directory and a free
//! port, stoppable and restartable (for the "database down mid-stream" tests).
//! [`TestDb`] is a fresh database with the migrations applied: inside the suite's
//! server when `SECKILL_TEST_MYSQL_URL` names one (`deploy/local/test.sh` starts one
//! on a free port for the whole run), otherwise inside a [`MariaDb`] of its own.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::ConnectOptions;

use crate::process::{free_port, run_ok, wait_until, ChildGuard};

/// Environment variable naming a server to create test databases in,
/// e.g. `mysql://root@127.0.0.1:34567`.
pub const SUITE_SERVER_ENV: &str = "SECKILL_TEST_MYSQL_URL";

/// The `mariadb` command-line client, as root, for the server at `host:port`; add
/// `-e <statement>` and run it.
pub fn mariadb_client(host: &str, port: u16) -> Command {
    let mut cmd = Command::new("mariadb");
    cmd.args(["-h", host, "-P", &port.to_string(), "-uroot"]);
    cmd
}

/// A `mariadbd` owned by the test.
#[derive(Debug)]
pub struct MariaDb {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<ChildGuard>,
}

impl MariaDb {
    /// Initialises a data directory and starts the server (about a second). A failed
    /// start is retried on a fresh directory and port, 3 times at most.
    pub fn start() -> Self {
        crate::process::with_retries("MariaDB", Self::try_start)
    }

    fn try_start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("seckill-mariadb-")
            .tempdir()
            .expect("tempdir");
        let data = dir.path().join("data");
        run_ok(
            Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .args([
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--user=root",
                ]),
        );
        let mut db = Self {
            port: free_port(None),
            dir,
            child: None,
        };
        db.start_server();
        db
    }

    /// `mysql://root@127.0.0.1:<port>` (no database).
    pub fn server_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL): clients see the database vanish mid-transaction.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.start_server();
    }

    fn start_server(&mut self) {
        let data = self.dir.path().join("data");
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={}", self.port))
            .arg(format!(
                "--socket={}",
                self.dir.path().join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("mysqld.pid").display()
            ))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=128M",
                "--innodb-log-file-size=32M",
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=500",
            ]);
        let log = self.dir.path().join("mariadbd.log");
        self.child = Some(ChildGuard::spawn("mariadbd", cmd, &log).expect("spawn mariadbd"));
        let port = self.port;
        wait_until(
            &format!("mariadbd on {port}"),
            Duration::from_secs(30),
            || {
                mariadb_client("127.0.0.1", port)
                    .args(["-e", "SELECT 1"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
    }

    /// Directory with the server's log, for debugging.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// A fresh, migrated database, dropped with the handle.
#[derive(Debug)]
pub struct TestDb {
    /// Database name (`seckill_t_<random>`).
    pub name: String,
    server_url: String,
    own_server: Option<MariaDb>,
    pool: MySqlPool,
}

impl TestDb {
    /// A database in the suite's server, or in a server of its own.
    pub async fn create() -> Self {
        match std::env::var(SUITE_SERVER_ENV) {
            Ok(url) if !url.is_empty() => Self::create_in(url, None).await,
            _ => {
                let server = MariaDb::start();
                Self::create_in(server.server_url(), Some(server)).await
            }
        }
    }

    /// A database in a server the test owns and may stop and restart.
    pub async fn create_owned() -> Self {
        let server = MariaDb::start();
        Self::create_in(server.server_url(), Some(server)).await
    }

    /// A database in a server someone else owns (the suite's, as with
    /// `SECKILL_TEST_MYSQL_URL`): dropped from that server when the handle goes.
    pub async fn create_on(server_url: &str) -> Self {
        Self::create_in(server_url.to_string(), None).await
    }

    async fn create_in(server_url: String, own_server: Option<MariaDb>) -> Self {
        let name = format!("seckill_t_{:016x}", rand::random::<u64>());
        let admin: MySqlConnectOptions = server_url.parse().expect("server url");
        let mut conn = admin
            .connect()
            .await
            .expect("connect to the test MariaDB server");
        sqlx::query(&format!("CREATE DATABASE `{name}`"))
            .execute(&mut conn)
            .await
            .expect("create database");
        drop(conn);
        let pool = MySqlPoolOptions::new()
            .max_connections(8)
            .connect(&format!("{server_url}/{name}"))
            .await
            .expect("connect to the test database");
        seckill_daemon::migrator()
            .run(&pool)
            .await
            .expect("migrations");
        Self {
            name,
            server_url,
            own_server,
            pool,
        }
    }

    /// URL of the database, for daemon configs.
    pub fn url(&self) -> String {
        format!("{}/{}", self.server_url, self.name)
    }

    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The server, when this database has one of its own.
    pub fn server(&mut self) -> Option<&mut MariaDb> {
        self.own_server.as_mut()
    }
}

impl Drop for TestDb {
    /// Drops the database without waiting for it. A test's daemons run on the test's
    /// runtime, often its only thread; when the test ends, one of them may hold a
    /// transaction open in this database (aborted, but not yet polled again), and its
    /// rollback needs that thread. `DROP DATABASE` waits for the transaction's metadata
    /// lock, so waiting for it here would deadlock the test forever. The `mariadb` client
    /// runs on its own (a thread reaps it): the drop happens once the locks go, at the
    /// latest when this process exits and its connections close.
    fn drop(&mut self) {
        if self.own_server.is_some() {
            return; // the whole server goes with it
        }
        let Ok(opts) = self.server_url.parse::<MySqlConnectOptions>() else {
            return;
        };
        let child = mariadb_client(opts.get_host(), opts.get_port())
            .arg("-e")
            .arg(format!("DROP DATABASE IF EXISTS `{}`", self.name))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = child {
            std::thread::spawn(move || child.wait());
        }
    }
}
