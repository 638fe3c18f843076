//! The systemd units in `deploy/systemd/` (docs/operations.md, "systemd units"): each one
//! passes `systemd-analyze verify` against the real binaries, keeps the sandbox the docs
//! promise (and `systemd-analyze security` rates it OK), validates the config before it
//! starts or reloads, reloads the way its daemon does (SIGHUP; pingora's upgrade for the
//! gateway), and every command line in it is one the real binary accepts with the
//! shipped config and the unit's environment. Needs
//! `cargo build -p stockd -p orderd -p gateway --bins` first.
#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]

use std::path::{Path, PathBuf};
use std::process::Command;

use seckill_tests::process::workspace_bin;

const DAEMONS: [&str; 3] = ["stockd", "orderd", "gateway"];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn unit_text(daemon: &str) -> String {
    std::fs::read_to_string(repo(&format!("deploy/systemd/{daemon}.service"))).unwrap()
}

/// `Key=value` lines of the unit (all sections), in order; comments dropped.
fn entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('[') && !l.is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn values<'a>(e: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    e.iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// The unit with `/usr/local/bin/` pointing at the built binaries.
fn with_built_binaries(text: &str) -> String {
    let dir = workspace_bin("stockd")
        .parent()
        .unwrap()
        .display()
        .to_string();
    text.replace("/usr/local/bin/", &format!("{dir}/"))
}

#[test]
fn every_unit_passes_systemd_analyze_verify_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    for daemon in DAEMONS {
        let unit = dir.path().join(format!("{daemon}.service"));
        std::fs::write(&unit, with_built_binaries(&unit_text(daemon))).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit)
            .output()
            .expect("systemd-analyze (Debian package systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "{daemon}.service: {stderr}"
        );
    }
    // The check can fail: a misspelt key is only a warning to verify, and it is caught.
    let bad = dir.path().join("stockd.service");
    let text = with_built_binaries(&unit_text("stockd")).replace("ProtectHome=", "ProtectHom=");
    std::fs::write(&bad, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ProtectHom"));
}

#[test]
fn every_unit_is_sandboxed_and_rated_ok_by_systemd_analyze_security() {
    let expected = [
        ("DynamicUser", "yes"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("CapabilityBoundingSet", ""),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallFilter", "@system-service"),
        ("Restart", "on-failure"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for daemon in DAEMONS {
        let e = entries(&unit_text(daemon));
        for (key, value) in expected {
            assert_eq!(values(&e, key), vec![value], "{daemon}.service: {key}");
        }
        // systemd's exposure score, 0 (locked down) to 10; "OK" is below 2.0 (20 in
        // tenths, the unit of --threshold).
        let unit = dir.path().join(format!("{daemon}.service"));
        std::fs::write(&unit, with_built_binaries(&unit_text(daemon))).unwrap();
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--threshold=20"])
            .arg(&unit)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{daemon}.service exposure above 2.0:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let gw = entries(&unit_text("gateway"));
    let nofile: u64 = values(&gw, "LimitNOFILE")[0].parse().unwrap();
    assert!(nofile >= 65_536, "the gateway holds a crowd's sockets");
}

#[test]
fn a_bad_config_never_replaces_a_running_good_one() {
    for daemon in DAEMONS {
        let e = entries(&unit_text(daemon));
        let conf = format!("/etc/seckill/{daemon}.toml");
        let check = format!("/usr/local/bin/{daemon} -t -c {conf}");
        assert_eq!(values(&e, "ExecStartPre"), vec![check.as_str()], "{daemon}");
        let reload = values(&e, "ExecReload");
        assert_eq!(reload[0], check, "{daemon}: reload validates first");
        match daemon {
            "gateway" => {
                // pingora's graceful upgrade, as pingora documents it for systemd.
                assert_eq!(values(&e, "Type"), vec!["forking"]);
                assert_eq!(
                    reload[1..],
                    [
                        "/bin/kill -QUIT $MAINPID",
                        "/usr/local/bin/gateway -u -d -c /etc/seckill/gateway.toml"
                    ]
                );
                let pid = values(&e, "PIDFile")[0];
                assert!(
                    values(&e, "Environment")
                        .contains(&&*format!("GATEWAY__SERVER__PID_FILE={pid}")),
                    "the pid file the gateway writes is the one systemd reads"
                );
            }
            _ => assert_eq!(reload[1..], ["/bin/kill -HUP $MAINPID"], "{daemon}"),
        }
    }
}

#[test]
fn every_command_line_of_the_units_is_accepted_by_the_real_binary() {
    for daemon in DAEMONS {
        let e = entries(&unit_text(daemon));
        let env: Vec<(String, String)> = values(&e, "Environment")
            .iter()
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        let commands = ["ExecStartPre", "ExecStart", "ExecReload"]
            .iter()
            .flat_map(|k| values(&e, k))
            .filter(|c| c.starts_with("/usr/local/bin/"));
        for command in commands {
            // The shipped local config stands in for /etc/seckill; `-t` makes any line
            // (also `-d`, `-u`) parse its flags and validate, then exit.
            let mut args: Vec<String> = command
                .split_whitespace()
                .skip(1)
                .map(|a| {
                    a.replace(
                        &format!("/etc/seckill/{daemon}.toml"),
                        &repo(&format!("deploy/local/{daemon}.toml"))
                            .display()
                            .to_string(),
                    )
                })
                .collect();
            if !args.iter().any(|a| a == "-t") {
                args.push("-t".into());
            }
            let out = Command::new(workspace_bin(daemon))
                .args(&args)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{daemon}.service `{command}`: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
