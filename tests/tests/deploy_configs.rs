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
        _ => Err(
            "no validator for this kind of file: add one to tests/tests/deploy_configs.rs".into(),
        ),
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
