//! `deploy/local/lib.sh`'s port checks, which `up.sh` runs before it starts each daemon on
//! its fixed port: a port a client connection still holds, in its TIME-WAIT too, is not
//! free, because the daemon's bind would fail on it ("Address already in use").

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `script` in bash with `deploy/local/lib.sh` sourced (its state in a temp dir).
fn lib_sh(script: &str) -> Output {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/local/lib.sh");
    let state = tempfile::tempdir().unwrap();
    Command::new("bash")
        .arg("-c")
        .arg(format!("source {}; {script}", lib.display()))
        .env("SECKILL_STATE", state.path())
        .output()
        .expect("run bash")
}

/// A loopback port that a client connection left in TIME-WAIT: the client closes first,
/// then the server.
fn port_in_client_time_wait() -> u16 {
    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(server.local_addr().unwrap()).unwrap();
    let port = client.local_addr().unwrap().port();
    let (mut accepted, _) = server.accept().unwrap();
    drop(client);
    let mut rest = Vec::new();
    accepted.read_to_end(&mut rest).unwrap(); // the client's FIN
    drop(accepted);
    // The client's side reaches TIME-WAIT once the server's FIN is in.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ss = Command::new("ss")
            .args(["-Htan", &format!("sport = :{port}")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if ss.contains("TIME-WAIT") || Instant::now() > deadline {
            return port;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_port_a_client_left_in_time_wait_is_not_free_for_a_daemon() {
    let port = port_in_client_time_wait();
    // What the daemon would do: bind with SO_REUSEADDR (std sets it on Unix, as tokio's
    // TcpListener does). It fails.
    let bind = TcpListener::bind(("127.0.0.1", port));
    assert!(
        bind.is_err(),
        "the bind this test relies on succeeded: port {port} was not held"
    );

    let held = lib_sh(&format!("port_bindable {port}"));
    assert!(!held.status.success(), "port_bindable said {port} is free");
    let waited = lib_sh(&format!("wait_port_free {port} 1"));
    assert!(!waited.status.success());
    let err = String::from_utf8_lossy(&waited.stderr);
    assert!(
        err.contains(&format!("127.0.0.1:{port} is still held by: TIME-WAIT")),
        "{err}"
    );
}

#[test]
fn a_free_port_is_free_and_a_listened_one_is_not() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = listener.local_addr().unwrap().port();
    let free = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = lib_sh(&format!(
        "port_bindable {free} && echo free; port_bindable {taken} || echo taken; \
         wait_port_free {free} 1 && echo waited"
    ));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "free\ntaken\nwaited\n", "{out:?}");
}
