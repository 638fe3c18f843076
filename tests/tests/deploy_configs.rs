//! Every file shipped under `deploy/` is parsed and validated here, so a config that ships
//! is a config that loads. A file of a kind this test does not know fails it: add its
//! validator when you add the file.
#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "state") {
            continue; // deploy/local/state: the local stack's runtime data, not shipped
        }
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Validates one shipped file; `Err` says why it is bad or that no validator knows it.
fn validate(path: &Path) -> Result<&'static str, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    match (name.as_str(), ext.as_str()) {
        ("stockd.toml", _) => stockd::Config::load(path)
            .map(|_| "stockd config")
            .map_err(|e| e.to_string()),
        ("orderd.toml", _) => orderd::config::Config::load(path)
            .map(|_| "orderd config")
            .map_err(|e| e.to_string()),
        ("gateway.toml", _) => gateway::config::load(path)
            .map(|_| "gateway config")
            .map_err(|e| e.to_string()),
        // Parsed and validated by seckillctl's own test
        // (`stockd/src/bin/seckillctl/activity_file.rs`); here: well-formed TOML.
        ("activity.toml", _) => std::fs::read_to_string(path)
            .map_err(|e| e.to_string())?
            .parse::<toml::Table>()
            .map(|_| "activity file")
            .map_err(|e| e.to_string()),
        (_, "json") => {
            serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(path).unwrap())
                .map(|_| "JSON")
                .map_err(|e| e.to_string())
        }
        (_, "sh") => {
            let out = Command::new("bash")
                .arg("-n")
                .arg(path)
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok("shell script")
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        }
        // The bench helpers in Python: compiled (syntax) without running them, nothing
        // written beside them.
        (_, "py") => {
            let code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')";
            let out = Command::new("python3")
                .args(["-c", code])
                .arg(path)
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.success() {
                Ok("Python script")
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        }
        // systemd units: `systemd-analyze verify` (deeper checks: deploy_systemd.rs).
        (_, "service") => systemd_verify(path).map(|_| "systemd unit"),
        // Prometheus alert rules and their unit tests (promtool, Debian package
        // `prometheus`; deploy/local/test.sh installs it).
        ("alerts.yml", _) => promtool(&["check", "rules"], path).map(|_| "alert rules"),
        ("alerts_test.yml", _) => promtool(&["test", "rules"], path).map(|_| "alert tests"),
        _ => Err(
            "no validator for this kind of file: add one to tests/tests/deploy_configs.rs".into(),
        ),
    }
}

/// Runs `cmd` and returns `Err` with its output when it fails or prints to stderr.
fn quiet_success(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() && stderr.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}\n{}{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// `systemd-analyze verify` of a unit whose binaries under `/usr/local/bin/` are stood in
/// for by `/bin/true` (verify wants them to exist). Any warning fails it: verify exits 0
/// on an unknown key, only printing it.
fn systemd_verify(path: &Path) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for bin in ["stockd", "orderd", "gateway"] {
        std::os::unix::fs::symlink("/bin/true", dir.path().join(bin)).map_err(|e| e.to_string())?;
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let unit = dir.path().join(path.file_name().unwrap());
    let bins = format!("{}/", dir.path().display());
    std::fs::write(&unit, text.replace("/usr/local/bin/", &bins)).map_err(|e| e.to_string())?;
    quiet_success(Command::new("systemd-analyze").arg("verify").arg(&unit))
}

fn promtool(args: &[&str], path: &Path) -> Result<(), String> {
    let out = Command::new("promtool")
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run promtool (install the Debian package prometheus): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_file_under_deploy_parses_and_validates() {
    let mut files = Vec::new();
    files_under(&deploy_dir(), &mut files);
    files.sort();
    assert!(files.len() >= 8, "found only {files:?}");
    let mut bad = Vec::new();
    for f in &files {
        match validate(f) {
            Ok(kind) => eprintln!("ok   {kind:<15} {}", f.display()),
            Err(e) => bad.push(format!("{}: {e}", f.display())),
        }
    }
    assert!(bad.is_empty(), "invalid shipped files:\n{}", bad.join("\n"));
}

#[test]
fn the_daemons_refuse_a_config_with_a_bad_field_and_name_it() {
    let dir = tempfile::tempdir().unwrap();
    for (daemon, extra) in [
        ("stockd", "bogus_key"),
        ("orderd", "bogus_key"),
        ("gateway", "bogus_key"),
    ] {
        let shipped =
            std::fs::read_to_string(deploy_dir().join(format!("local/{daemon}.toml"))).unwrap();
        let bad = dir.path().join(format!("{daemon}.toml"));
        std::fs::write(&bad, format!("{extra} = 1\n{shipped}")).unwrap();
        let err = match daemon {
            "stockd" => stockd::Config::load(&bad)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            "orderd" => orderd::config::Config::load(&bad)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            _ => gateway::config::load(&bad)
                .map(|_| ())
                .unwrap_err()
                .to_string(),
        };
        assert!(
            err.contains(&bad.display().to_string()),
            "{daemon}: names the file: {err}"
        );
        assert!(err.contains(extra), "{daemon}: names the field: {err}");
        assert!(!err.contains('\n'), "{daemon}: one line: {err}");
    }
}
