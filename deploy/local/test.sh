#!/usr/bin/env bash
# Runs the whole test suite on this machine, installing what it needs when missing:
# Rust's cargo, gcc, redis-server, MariaDB, Chromium and its driver (browser test).
# Tests start their own Redis Cluster nodes on free ports; this script starts one MariaDB
# server for the run on a free port (each test creates its own database in it) and stops it
# at the end. Arguments go to `cargo test` (e.g. `./deploy/local/test.sh -p seckill-lua`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_rust
# The suite opens thousands of connections; keep the local stack's fixed ports out of the
# ephemeral range first, so none of them is left holding a port a daemon of the stack (the demo
# after the suite in CI, or the developer's stack) is about to listen on. The suite itself uses
# free ports only.
reserve_ports "${DAEMON_PORTS[@]}" "${REDIS_PORTS[@]}"
ensure_pkg cc gcc
ensure_pkg redis-server redis-server
ensure_pkg redis-cli redis-tools
ensure_pkg mariadbd mariadb-server
ensure_pkg mariadb mariadb-client
ensure_pkg curl curl
ensure_pkg chromium chromium
ensure_pkg chromedriver chromium-driver
# The ops checks: promtool checks and unit-tests deploy/prometheus/, systemd-analyze
# verifies deploy/systemd/ (tests/tests/deploy_configs.rs, deploy_systemd.rs).
ensure_pkg promtool prometheus
ensure_pkg systemd-analyze systemd
# lib.sh's port checks (tests/tests/deploy_local_ports.rs, and up.sh): ss lists the sockets on
# a port, perl tries the bind.
ensure_pkg ss iproute2
ensure_pkg perl perl-base

# ---------------------------------------------------------------- the suite's MariaDB
SUITE_DIR=$(mktemp -d /tmp/seckill-test-mariadb.XXXXXX)
MYSQL_PID=""
cleanup() {
    if [ -n "$MYSQL_PID" ] && kill -0 "$MYSQL_PID" 2>/dev/null; then
        kill -TERM "$MYSQL_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$MYSQL_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$MYSQL_PID" 2>/dev/null || true
    fi
    rm -rf "$SUITE_DIR"
}
trap cleanup EXIT

mariadb-install-db --no-defaults --datadir="$SUITE_DIR/data" --auth-root-authentication-method=normal \
    --skip-test-db --user="$(id -un)" >"$SUITE_DIR/install.log" 2>&1 || { cat "$SUITE_DIR/install.log" >&2; die "mariadb-install-db failed"; }
# A free port below the kernel's ephemeral range (the suite's own outgoing connections take
# ports from that range, and one took the chosen port between the check and the bind in a CI
# run); a start that still loses its port to someone else tries another.
low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "${low:-0}" -gt 21000 ] 2>/dev/null || low=32768
free_port() {
    local candidate
    for _ in $(seq 50); do
        candidate=$((20000 + RANDOM % (low - 20000)))
        tcp_open "$candidate" || { echo "$candidate"; return 0; }
    done
    return 1
}
port=""
for attempt in 1 2 3; do
    port=$(free_port) || die "no free port for the suite's MariaDB"
    mariadbd --no-defaults --datadir="$SUITE_DIR/data" --port="$port" --bind-address=127.0.0.1 \
        --socket="$SUITE_DIR/mysqld.sock" --pid-file="$SUITE_DIR/mysqld.pid" --user="$(id -un)" --skip-log-bin \
        --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=2 --max-connections=1000 \
        >"$SUITE_DIR/mariadbd.log" 2>&1 &
    MYSQL_PID=$!
    # Until it answers, for 30 s, or until it exits (a lost bind aborts it at once).
    up=0
    for _ in $(seq 300); do
        mariadb -h127.0.0.1 -P"$port" -uroot -e 'SELECT 1' >/dev/null 2>&1 && { up=1; break; }
        kill -0 "$MYSQL_PID" 2>/dev/null || break
        sleep 0.1
    done
    [ "$up" = 1 ] && break
    if grep -q "Address already in use" "$SUITE_DIR/mariadbd.log" && [ "$attempt" -lt 3 ]; then
        log "port $port was taken before MariaDB bound it; trying another"
        wait "$MYSQL_PID" 2>/dev/null
        continue
    fi
    cat "$SUITE_DIR/mariadbd.log" >&2; die "the suite's MariaDB did not start"
done
export SECKILL_TEST_MYSQL_URL="mysql://root@127.0.0.1:$port"
log "suite MariaDB on 127.0.0.1:$port"

# ---------------------------------------------------------------- build, then test
cd "$ROOT"
log "building the binaries the child-process tests run"
cargo build --workspace --bins
cargo test --workspace --no-run "$@"
# The suite itself takes minutes; a test that hangs must fail the run with its name, not
# hold CI until its own time limit. cargo names a test running over 60 s; a log kept here
# lets the message below repeat those names.
limit=${SECKILL_TEST_TIMEOUT_SECS:-1800}
log "running the tests (at most ${limit} s: SECKILL_TEST_TIMEOUT_SECS)"
status=0
timeout --kill-after=30 "$limit" cargo test --workspace --no-fail-fast "$@" 2>&1 \
    | tee "$SUITE_DIR/cargo-test.log" || status=$?
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    grep 'has been running for over' "$SUITE_DIR/cargo-test.log" >&2 || true
    die "the tests ran past ${limit} s and were stopped: a test hung (named above)"
fi
exit "$status"
