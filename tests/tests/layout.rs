//! The shape issue 12 set, kept by a test: the gateway's state modules and filters
//! import nothing of the pipeline that runs them, the pipeline imports no handler,
//! stockd's per-shard state imports neither the catalog nor the batch driver, and
//! nothing outside `lua/` names a Lua script to call or spells a Redis key.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `.rs` file under `dir` (relative to the workspace), recursively.
fn sources(dir: &str) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path.strip_prefix(base).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &root().join(dir), &mut out);
    out.sort();
    out
}

/// The lines of `rel` that import or name `module` (doc comments aside).
fn uses(rel: &str, module: &str) -> Vec<String> {
    read(rel)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| l.contains(module))
        .map(|l| format!("{rel}: {}", l.trim()))
        .collect()
}

#[test]
fn the_gateway_state_and_filters_import_nothing_of_the_pipeline_that_runs_them() {
    let state = [
        "gateway/src/shared.rs",
        "gateway/src/ip_ban.rs",
        "gateway/src/rate_limit.rs",
        "gateway/src/sold_out.rs",
        "gateway/src/auth.rs",
        "gateway/src/purchase_token.rs",
        "gateway/src/admission.rs",
    ];
    let mut bad = Vec::new();
    for f in state {
        for m in ["crate::proxy", "crate::filters", "crate::handlers"] {
            bad.extend(uses(f, m));
        }
    }
    for f in sources("gateway/src/filters") {
        for m in ["crate::proxy", "crate::handlers"] {
            bad.extend(uses(&f, m));
        }
    }
    bad.extend(uses("gateway/src/proxy.rs", "crate::handlers"));
    assert!(
        bad.is_empty(),
        "imports against the pipeline's shape:\n{}",
        bad.join("\n")
    );
}

#[test]
fn stockd_per_shard_state_imports_neither_the_catalog_nor_the_batch_driver() {
    let mut bad = Vec::new();
    for m in [
        "crate::catalog",
        "crate::batch",
        "crate::app",
        "crate::stock",
    ] {
        bad.extend(uses("stockd/src/shard.rs", m));
    }
    for m in ["crate::batch", "crate::app"] {
        bad.extend(uses("stockd/src/catalog.rs", m));
    }
    assert!(
        bad.is_empty(),
        "an import cycle is back:\n{}",
        bad.join("\n")
    );
}

#[test]
fn only_lua_names_a_script_to_call_or_spells_a_redis_key() {
    let mut bad = Vec::new();
    for dir in ["gateway/src", "stockd/src", "orderd/src", "daemon/src"] {
        for f in sources(dir) {
            for needle in [
                "scripts::RESERVE",
                "scripts::RELEASE",
                "scripts::TAKE",
                "scripts::GIVE",
                "scripts::WARM",
                "\"sk:",
            ] {
                bad.extend(uses(&f, needle));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "script calls or keys built outside lua/:\n{}",
        bad.join("\n")
    );
}
