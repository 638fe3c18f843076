#!/usr/bin/env bash
# Brings the local stack up, idempotently: a 3-master Redis Cluster (127.0.0.1:7001-7003, AOF
# everysec), MariaDB (the one on 127.0.0.1:3306 when it answers, else one of our own), database
# `seckill` migrated, then stockd (gRPC :50051), orderd (gRPC :50052) and the gateway
# (HTTP :8080, admin :9091), each waited on until healthy. Everything it starts is recorded in
# deploy/local/state/pids and stopped by down.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_pkg redis-server redis-server
ensure_pkg redis-cli redis-tools
ensure_pkg mariadb mariadb-client
ensure_pkg curl curl

# ---------------------------------------------------------------- Redis Cluster
redis_up() {
    local port=$1 dir="$STATE/redis/$1"
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then return 0; fi
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout 5000 --appendonly yes --appendfsync everysec --save "" \
        --dir "$dir" --daemonize yes --pidfile "$STATE/pids/redis-$port.pid" --logfile "$STATE/logs/redis-$port.log" \
        || die "redis-server on $port did not start (see $STATE/logs/redis-$port.log)"
    wait_for "redis $port" 10 redis-cli -p "$port" ping || die "redis on $port does not answer"
}
for p in "${REDIS_PORTS[@]}"; do redis_up "$p"; done

if redis-cli -p 7001 cluster info | grep -q 'cluster_slots_assigned:0'; then
    log "creating the Redis Cluster on ${REDIS_PORTS[*]}"
    redis-cli -p 7001 cluster addslotsrange 0 5460 >/dev/null
    redis-cli -p 7002 cluster addslotsrange 5461 10922 >/dev/null
    redis-cli -p 7003 cluster addslotsrange 10923 16383 >/dev/null
    redis-cli -p 7001 cluster meet 127.0.0.1 7002 >/dev/null
    redis-cli -p 7001 cluster meet 127.0.0.1 7003 >/dev/null
fi
cluster_ok() { for p in "${REDIS_PORTS[@]}"; do redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || return 1; done; }
wait_for "cluster ok" 30 cluster_ok || die "Redis Cluster is not healthy: redis-cli -p 7001 cluster info"

# ---------------------------------------------------------------- MariaDB
mysql_ok() { mariadb -h127.0.0.1 -P3306 -uroot -e 'SELECT 1'; }
if ! mysql_ok >/dev/null 2>&1; then
    ensure_pkg mariadbd mariadb-server
    if ! mysql_ok >/dev/null 2>&1; then
        log "no MariaDB on 127.0.0.1:3306; starting our own in $STATE/mariadb"
        if [ ! -d "$STATE/mariadb/mysql" ]; then
            mariadb-install-db --no-defaults --datadir="$STATE/mariadb" --auth-root-authentication-method=normal \
                --skip-test-db --user="$(id -un)" >"$STATE/logs/mariadb-install.log" 2>&1 \
                || die "mariadb-install-db failed (see $STATE/logs/mariadb-install.log)"
        fi
        start_bg mariadb mariadbd --no-defaults --datadir="$STATE/mariadb" --port=3306 --bind-address=127.0.0.1 \
            --socket="$STATE/mariadb.sock" --user="$(id -un)" --skip-log-bin
        wait_for "mariadb" 30 mysql_ok || die "MariaDB did not start (see $STATE/logs/mariadb.log)"
    fi
fi
mariadb -h127.0.0.1 -P3306 -uroot -e 'CREATE DATABASE IF NOT EXISTS seckill' || die "cannot create database seckill"

# ---------------------------------------------------------------- daemons
[ "${SKIP_BUILD:-0}" = 1 ] || build_bins
for b in stockd orderd gateway seckillctl; do [ -x "$BIN/$b" ] || die "$BIN/$b is missing"; done

reserve_ports "${DAEMON_PORTS[@]}" "${REDIS_PORTS[@]}"
daemon_up() { # name health-url ports [flags...]
    local name=$1 url=$2 ports=$3 p holder; shift 3
    if pid_alive "$name" && curl -fsS "$url" >/dev/null 2>&1; then return 0; fi
    stop_pid "$name"
    for p in $ports; do
        holder=$(port_holder "$p")
        [ -z "$holder" ] || die "$name cannot start: 127.0.0.1:$p is taken by $holder, which this stack did not start (a stack from another checkout? stop it with its own down.sh)"
        # A connection that got $p as its ephemeral port before the reservation above
        # (FIN-WAIT or CLOSE-WAIT after a test run) blocks the bind until it closes.
        wait_port_free "$p" 90 || die "$name cannot start: 127.0.0.1:$p is held by a connection that does not close"
    done
    start_bg "$name" "$BIN/$name" -c "$ROOT/deploy/local/$name.toml" "$@"
    wait_for "$name" 60 curl -fsS "$url" || { tail -n 20 "$STATE/logs/$name.log" >&2; die "$name did not become healthy"; }
}
# stockd applies the migrations (idempotent) before it serves.
daemon_up stockd http://127.0.0.1:9092/healthz "50051 9092" --migrate
daemon_up orderd http://127.0.0.1:9093/healthz "50052 9093"
daemon_up gateway http://127.0.0.1:9091/readyz "8080 9091"

cat <<MSG
The stack is up:
  web page and HTTP API   http://127.0.0.1:8080/          (OpenAPI: /api/openapi.json)
  gateway admin/metrics   http://127.0.0.1:9091/metrics   (/healthz, /readyz)
  stockd gRPC             127.0.0.1:50051                 (metrics http://127.0.0.1:9092/metrics)
  orderd gRPC             127.0.0.1:50052                 (metrics http://127.0.0.1:9093/metrics)
  Redis Cluster           127.0.0.1:7001-7003
  MariaDB                 $MYSQL_URL
  admin CLI               $BIN/seckillctl --help
  logs                    $STATE/logs/
Stop it with ./deploy/local/down.sh
MSG
