//! Config files: TOML, then environment overrides, then validation, on every load.
//!
//! Every daemon's config is a serde struct with `#[serde(deny_unknown_fields)]` (a
//! misspelt key is an error, not a silent default) that implements [`Validate`].
//! [`load`] reads the file, applies overrides from variables named
//! `{PREFIX}__{SECTION}__{FIELD}` (for example `STOCKD__REDIS__TIMEOUT_MS=500`;
//! the value is read as a TOML value, and as a plain string when it is not one),
//! deserializes, validates, and reports the first problem as one line:
//! `{file}: {field}: {problem}`.
//!
//! (Over 400 lines: the loader, its shared sections and their unit tests; the tests are
//! half of it.)

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// Checks that go beyond types: ranges, relations between fields, non-empty secrets.
pub trait Validate {
    /// Keys this config once spelled differently, as (old dotted path, new dotted path).
    /// A file or an environment override that still uses an old key is refused with an
    /// error naming the new one, rather than the bare "unknown field".
    const RENAMED: &'static [(&'static str, &'static str)] = &[];

    /// The first problem found, naming the field by its dotted path.
    fn validate(&self) -> Result<(), FieldError>;
}

/// `[admin]`, the same in every daemon: the loopback port serving `/metrics` and
/// `/healthz`.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// `host:port` of the admin listener; omit to disable it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
}

impl AdminSection {
    /// `admin.listen`, when given, is `host:port`.
    pub fn validate(&self) -> Result<(), FieldError> {
        match &self.listen {
            Some(l) => ensure_host_port(l, "admin.listen"),
            None => Ok(()),
        }
    }
}

/// `[log]`, the same in every daemon.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// JSON lines instead of text. Default false. Needs a restart to change.
    #[serde(default)]
    pub json: bool,
    /// Which events to log, in `RUST_LOG` syntax: a level (`error`, `warn`, `info`,
    /// `debug`, `trace`) or directives (`warn,stockd=debug`). Default: unset, which
    /// means `RUST_LOG` when set, else `info`. Checked on every load (a bad filter is
    /// refused naming `log.level`); applied live on a reload (SIGHUP).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "deserialize_log_level"
    )]
    pub level: Option<String>,
}

/// `log.level` is checked while the file is read, so every daemon refuses a bad filter
/// with the field named, without each `validate()` having to remember it.
fn deserialize_log_level<'de, D>(d: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::Deserialize;
    let level = String::deserialize(d)?;
    crate::telemetry::parse_filter(&level).map_err(serde::de::Error::custom)?;
    Ok(Some(level))
}

/// A problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, for example `redis.nodes`.
    pub field: String,
    pub problem: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

/// Fails with `field` when `cond` does not hold. Keeps `validate()` bodies flat.
pub fn ensure(cond: bool, field: &str, problem: impl Into<String>) -> Result<(), FieldError> {
    if cond {
        Ok(())
    } else {
        Err(FieldError::new(field, problem))
    }
}

/// Fails with `field` ("must be lo..=hi") unless `value` lies in `range`.
pub fn ensure_range<T: PartialOrd + std::fmt::Display>(
    value: T,
    range: std::ops::RangeInclusive<T>,
    field: &str,
) -> Result<(), FieldError> {
    let problem = format!("must be {}..={}", range.start(), range.end());
    ensure(range.contains(&value), field, problem)
}

/// `redis.replica_acks` (0..=5) and `redis.replica_ack_timeout_ms` (1..=10000, and below
/// `redis.timeout_ms`, the whole call's deadline, when acknowledgements are asked for):
/// the same fields in stockd and orderd.
pub fn ensure_replica_acks(
    acks: u32,
    ack_timeout_ms: u64,
    timeout_ms: u64,
) -> Result<(), FieldError> {
    ensure_range(acks, 0..=5, "redis.replica_acks")?;
    ensure_range(ack_timeout_ms, 1..=10_000, "redis.replica_ack_timeout_ms")?;
    ensure(
        acks == 0 || ack_timeout_ms < timeout_ms,
        "redis.replica_ack_timeout_ms",
        "must be below redis.timeout_ms (the whole call's deadline)",
    )
}

/// Fails with `field` unless `value` is `host:port` (a non-empty host and a port number).
pub fn ensure_host_port(value: &str, field: &str) -> Result<(), FieldError> {
    ensure(is_host_port(value), field, "must be host:port")
}

/// Fails with `field` unless `nodes` names at least one node and each is `host:port`.
pub fn ensure_nodes(nodes: &[String], field: &str) -> Result<(), FieldError> {
    ensure(!nodes.is_empty(), field, "must name at least one node")?;
    for n in nodes {
        ensure(is_host_port(n), field, format!("`{n}` is not host:port"))?;
    }
    Ok(())
}

/// `[redis.clusters.<name>]`: a named Redis Cluster that activities can be placed on, so a
/// hot sale runs on Redis nodes of its own (an activity's `redis_cluster` names one). Only
/// the nodes differ: every other `[redis]` setting applies to each named cluster too. The
/// `[redis]` section's own nodes are the default cluster, which also holds everything that
/// is not one activity's stock (the published-activity catalog, bans, rooms, budgets).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct NamedCluster {
    /// Nodes of this cluster, `host:port`; one is enough, the rest are discovered.
    pub nodes: Vec<String>,
}

/// Named clusters by name, in name order.
pub type NamedClusters = std::collections::BTreeMap<String, NamedCluster>;

/// How an activity names the default cluster (`[redis]`); the empty string does too.
pub const DEFAULT_CLUSTER: &str = "default";

/// Why `name` cannot name a cluster: 1..=32 characters of `a-z`, `0-9`, `_`, `-`.
pub fn cluster_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 32 {
        return Some("must be 1 to 32 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Some("may hold only a-z, 0-9, `_` and `-`");
    }
    None
}

/// The cluster an activity's `redis_cluster` names, `None` for the default one (`""` or
/// `"default"`).
pub fn named_cluster(redis_cluster: &str) -> Option<&str> {
    match redis_cluster {
        "" | DEFAULT_CLUSTER => None,
        name => Some(name),
    }
}

/// Checks `[redis.clusters]` (`field` is its dotted path, `redis.clusters`): valid names,
/// not `default`, and at least one `host:port` node each.
pub fn ensure_clusters(clusters: &NamedClusters, field: &str) -> Result<(), FieldError> {
    for (name, cluster) in clusters {
        let at = format!("{field}.{name}");
        if let Some(problem) = cluster_name_problem(name) {
            return Err(FieldError::new(at, format!("cluster name {problem}")));
        }
        ensure(
            name != DEFAULT_CLUSTER,
            &at,
            "`default` is the [redis] section's own cluster; name this one otherwise",
        )?;
        ensure_nodes(&cluster.nodes, &format!("{at}.nodes"))?;
    }
    Ok(())
}

fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// Why a config could not be loaded. Displays as one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid TOML: {problem}")]
    Syntax { path: String, problem: String },
    #[error("{path}: environment variable {var}: {problem}")]
    Env {
        path: String,
        var: String,
        problem: String,
    },
    #[error("{path}: {field}: {problem}")]
    Field {
        path: String,
        field: String,
        problem: String,
    },
}

/// Loads `path` with overrides from the process environment.
pub fn load<T: DeserializeOwned + Validate>(
    path: &Path,
    env_prefix: &str,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    load_str(
        &text,
        &path.display().to_string(),
        env_prefix,
        std::env::vars(),
    )
}

/// [`load`], also returning the file as TOML with the environment overrides applied
/// (before defaults): what a reload compares field by field with the running config.
pub fn load_table<T: DeserializeOwned + Validate>(
    path: &Path,
    env_prefix: &str,
) -> Result<(T, toml::Table), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    load_str_table(
        &text,
        &path.display().to_string(),
        env_prefix,
        std::env::vars(),
    )
}

/// Loads from text; `origin` names it in errors. `env` is the environment to read
/// overrides from (a parameter so tests need not touch the process environment).
pub fn load_str<T: DeserializeOwned + Validate>(
    text: &str,
    origin: &str,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    load_str_table(text, origin, env_prefix, env).map(|(value, _)| value)
}

/// [`load_str`], also returning the merged table ([`load_table`]).
pub fn load_str_table<T: DeserializeOwned + Validate>(
    text: &str,
    origin: &str,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(T, toml::Table), ConfigError> {
    let path = origin.to_string();
    let mut table: toml::Table =
        text.parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                path: path.clone(),
                problem: one_line(&e.to_string()),
            })?;
    apply_env(&mut table, &path, env_prefix, env)?;
    refuse_renamed(&table, T::RENAMED).map_err(|e| ConfigError::Field {
        path: path.clone(),
        field: e.field,
        problem: e.problem,
    })?;
    let value: T =
        serde_path_to_error::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
            let field = e.path().to_string();
            let problem = one_line(&e.inner().to_string());
            ConfigError::Field {
                path: path.clone(),
                field: if field == "." {
                    "(top level)".into()
                } else {
                    field
                },
                problem,
            }
        })?;
    value.validate().map_err(|e| ConfigError::Field {
        path,
        field: e.field,
        problem: e.problem,
    })?;
    Ok((value, table))
}

/// Default config path of a daemon when `-c` is not given.
pub fn default_path(daemon: &str) -> PathBuf {
    PathBuf::from(format!("deploy/local/{daemon}.toml"))
}

fn apply_env(
    table: &mut toml::Table,
    path: &str,
    prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let lead = format!("{prefix}__");
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(&lead))
        .collect();
    vars.sort();
    for (var, raw) in vars {
        let keys: Vec<String> = var[lead.len()..]
            .split("__")
            .map(|k| k.to_ascii_lowercase())
            .collect();
        if keys.iter().any(|k| k.is_empty()) {
            return Err(ConfigError::Env {
                path: path.into(),
                var,
                problem: "empty key segment".into(),
            });
        }
        let value = parse_env_value(&raw);
        let mut cursor = &mut *table;
        for key in &keys[..keys.len() - 1] {
            let entry = cursor
                .entry(key.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            cursor = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Env {
                        path: path.into(),
                        var,
                        problem: format!("`{key}` is not a section"),
                    })
                }
            };
        }
        cursor.insert(keys[keys.len() - 1].clone(), value);
    }
    Ok(())
}

/// The first old spelling in `renamed` that `table` still uses.
fn refuse_renamed(table: &toml::Table, renamed: &[(&str, &str)]) -> Result<(), FieldError> {
    for (old, new) in renamed {
        let mut parts = old.split('.').peekable();
        let mut cursor = table;
        while let Some(key) = parts.next() {
            match (cursor.get(key), parts.peek()) {
                (Some(_), None) => {
                    return Err(FieldError::new(
                        *old,
                        format!("renamed: write `{new}` instead"),
                    ))
                }
                (Some(toml::Value::Table(t)), Some(_)) => cursor = t,
                _ => break,
            }
        }
    }
    Ok(())
}

fn parse_env_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Conf {
        name: String,
        #[serde(default)]
        redis: Redis,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Redis {
        #[serde(default)]
        timeout_ms: u64,
        #[serde(default)]
        nodes: Vec<String>,
    }

    impl Validate for Conf {
        const RENAMED: &'static [(&'static str, &'static str)] =
            &[("redis.timeout", "redis.timeout_ms"), ("old_name", "name")];

        fn validate(&self) -> Result<(), FieldError> {
            ensure(!self.name.is_empty(), "name", "must not be empty")?;
            ensure(
                self.redis.timeout_ms <= 10_000,
                "redis.timeout_ms",
                "must be at most 10000",
            )
        }
    }

    fn load_conf(text: &str, env: &[(&str, &str)]) -> Result<Conf, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        load_str(text, "x.toml", "APP", env)
    }

    #[test]
    fn addresses_must_be_host_and_port() {
        assert!(ensure_host_port("127.0.0.1:50051", "grpc.listen").is_ok());
        for bad in ["", "127.0.0.1", ":80", "host:port", "h:70000"] {
            assert_eq!(
                ensure_host_port(bad, "grpc.listen").unwrap_err().field,
                "grpc.listen"
            );
        }
        assert!(ensure_nodes(&["a:1".into(), "b:2".into()], "redis.nodes").is_ok());
        assert_eq!(
            ensure_nodes(&[], "redis.nodes").unwrap_err().problem,
            "must name at least one node"
        );
        assert_eq!(
            ensure_nodes(&["a:1".into(), "b".into()], "redis.nodes")
                .unwrap_err()
                .problem,
            "`b` is not host:port"
        );
    }

    #[test]
    fn a_bad_log_level_is_refused_naming_the_field() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct WithLog {
            #[allow(dead_code)]
            log: LogSection,
        }
        impl Validate for WithLog {
            fn validate(&self) -> Result<(), FieldError> {
                Ok(())
            }
        }
        let load = |text: &str| load_str::<WithLog>(text, "x.toml", "APP", Vec::new());
        load("[log]\nlevel = \"warn,stockd=debug\"\n").unwrap();
        let e = load("[log]\nlevel = \"inf\"\n").unwrap_err().to_string();
        assert!(e.starts_with("x.toml: log.level: "), "{e}");
    }

    #[test]
    fn a_good_file_loads() {
        let c = load_conf("name = \"a\"\n[redis]\ntimeout_ms = 5\n", &[]).unwrap();
        assert_eq!(c.redis.timeout_ms, 5);
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_the_key() {
        let e = load_conf("name = \"a\"\n[redis]\ntime_out = 5\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml: redis"), "{e}");
        assert!(e.contains("unknown field `time_out`"), "{e}");
    }

    #[test]
    fn an_old_spelling_is_refused_naming_the_new_key() {
        let e = load_conf("name = \"a\"\n[redis]\ntimeout = 5\n", &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "x.toml: redis.timeout: renamed: write `redis.timeout_ms` instead"
        );
        let e = load_conf("old_name = \"a\"\n", &[])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "x.toml: old_name: renamed: write `name` instead");
        let e = load_conf("name = \"a\"\n", &[("APP__REDIS__TIMEOUT", "5")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("write `redis.timeout_ms` instead"), "{e}");
    }

    #[test]
    fn a_wrong_type_names_the_field() {
        let e = load_conf("name = \"a\"\n[redis]\ntimeout_ms = \"soon\"\n", &[]).unwrap_err();
        assert!(
            e.to_string().starts_with("x.toml: redis.timeout_ms:"),
            "{e}"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let e = load_conf("name = \"\"\n", &[]).unwrap_err();
        assert_eq!(e.to_string(), "x.toml: name: must not be empty");
    }

    #[test]
    fn bad_syntax_is_one_line_naming_the_file() {
        let e = load_conf("name = \n", &[]).unwrap_err().to_string();
        assert!(e.starts_with("x.toml: not valid TOML"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn environment_overrides_the_file_and_is_validated_too() {
        let c = load_conf(
            "name = \"a\"\n",
            &[
                ("APP__REDIS__TIMEOUT_MS", "7"),
                ("APP__REDIS__NODES", "[\"h:1\"]"),
                ("OTHER", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.redis.timeout_ms, 7);
        assert_eq!(c.redis.nodes, vec!["h:1"]);
        let e = load_conf("name = \"a\"\n", &[("APP__REDIS__TIMEOUT_MS", "70000")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "x.toml: redis.timeout_ms: must be at most 10000"
        );
        let c = load_conf("name = \"a\"\n", &[("APP__NAME", "plain words")]).unwrap();
        assert_eq!(c.name, "plain words");
    }
}
