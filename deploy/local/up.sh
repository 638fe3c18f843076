#!/usr/bin/env bash
# Brings the local stack up, idempotently: a Redis Cluster of 3 masters (127.0.0.1:7001-7003)
# with one replica each (7004-7006), AOF everysec on every node; MariaDB (the one on
# 127.0.0.1:3306 when it answers, else one of our own); database `seckill` migrated; then
# stockd (gRPC :50051), orderd (gRPC :50052) and the gateway (HTTP :8080, admin :9091), each
# waited on until healthy. Everything it starts is recorded in deploy/local/state/pids and
# stopped by down.sh.
#
#   deploy/local/up.sh                 # the stack above
#   deploy/local/up.sh --fleet 3       # 3 stockd, 3 orderd, 3 gateways (ports: lib.sh, docs/operations.md)
#   deploy/local/up.sh --replicas 0    # Redis masters only (a laptop); also SECKILL_REDIS_REPLICAS=0
#
# Flags: --fleet N (1..20, default 1: N instances of each daemon; a second run with a smaller N
# stops the extra ones; instance 1 keeps the shipped config's ports, the others get their
# own, and with N >= 2 every gateway is given every stockd and orderd as upstreams),
# --replicas 0|1 (replicas per Redis master, default 1). Environment: SECKILL_REDIS_REPLICAS,
# SECKILL_REDIS_NODE_TIMEOUT_MS (cluster-node-timeout, default 5000), SECKILL_PROFILE=debug
# (debug binaries), SKIP_BUILD=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FLEET=1
usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --fleet) [ $# -ge 2 ] || die "--fleet needs a value (see --help)"; FLEET=$2; shift ;;
        --fleet=*) FLEET=${1#--fleet=} ;;
        --replicas) [ $# -ge 2 ] || die "--replicas needs a value (see --help)"; REDIS_REPLICAS=$2; shift ;;
        --replicas=*) REDIS_REPLICAS=${1#--replicas=} ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown flag $1 (see --help)" ;;
    esac
    shift
done
[[ $FLEET =~ ^[0-9]+$ ]] && [ "$FLEET" -ge 1 ] && [ "$FLEET" -le "$FLEET_MAX" ] \
    || die "--fleet must be a whole number from 1 to $FLEET_MAX, got '$FLEET'"
[[ $REDIS_REPLICAS =~ ^[01]$ ]] \
    || die "--replicas (SECKILL_REDIS_REPLICAS) must be 0 or 1, got '$REDIS_REPLICAS'"
[[ $REDIS_NODE_TIMEOUT_MS =~ ^[0-9]+$ ]] && [ "$REDIS_NODE_TIMEOUT_MS" -ge 100 ] \
    || die "SECKILL_REDIS_NODE_TIMEOUT_MS must be a whole number of ms, at least 100, got '$REDIS_NODE_TIMEOUT_MS'"

ensure_pkg redis-server redis-server
ensure_pkg redis-cli redis-tools
ensure_pkg mariadb mariadb-client
ensure_pkg curl curl

# ---------------------------------------------------------------- Redis Cluster
WANTED=("${REDIS_MASTER_PORTS[@]}")
[ "$REDIS_REPLICAS" = 1 ] && WANTED+=("${REDIS_REPLICA_PORTS[@]}")

redis_up() {
    local port=$1 dir="$STATE/redis/$1"
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then return 0; fi
    mkdir -p "$dir"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout "$REDIS_NODE_TIMEOUT_MS" --appendonly yes --appendfsync everysec --save "" \
        --dir "$dir" --daemonize yes --pidfile "$STATE/pids/redis-$port.pid" --logfile "$STATE/logs/redis-$port.log" \
        || die "redis-server on $port did not start (see $STATE/logs/redis-$port.log)"
    wait_for "redis $port" 10 redis-cli -p "$port" ping || die "redis on $port does not answer"
}
for p in "${WANTED[@]}"; do redis_up "$p"; done

if redis-cli -p 7001 cluster info | grep -q 'cluster_slots_assigned:0'; then
    log "creating the Redis Cluster on ${REDIS_MASTER_PORTS[*]}"
    redis-cli -p 7001 cluster addslotsrange 0 5460 >/dev/null
    redis-cli -p 7002 cluster addslotsrange 5461 10922 >/dev/null
    redis-cli -p 7003 cluster addslotsrange 10923 16383 >/dev/null
fi
# Every node wanted joins (a no-op for those known already, e.g. on a second run).
for p in "${WANTED[@]:1}"; do
    redis-cli -p 7001 cluster nodes | grep -q " 127.0.0.1:$p@" || redis-cli -p 7001 cluster meet 127.0.0.1 "$p" >/dev/null
done
knows_all() {
    local p
    for p in "${WANTED[@]}"; do
        [ "$(redis-cli -p "$p" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" -ge "${#WANTED[@]}" ] || return 1
    done
}
wait_for "every Redis node to know the others" 30 knows_all || die "the Redis nodes do not find each other: redis-cli -p 7001 cluster nodes"

# A replica port still a master without slots (a new node) follows its master: 7004 the
# master of 7001's slots... in the normal case 7001 itself, after a failover whichever node
# 7001 follows now.
master_id_of() { # PORT: the node id of PORT when it is a master, else of the master it follows
    redis-cli -p "$1" cluster nodes | awk '$3 ~ /myself/ { print ($4 == "-" ? $1 : $4) }'
}
owns_nothing() { # PORT: a master serving no slot
    redis-cli -p "$1" cluster nodes | awk '$3 ~ /myself/ && $3 ~ /master/ && NF == 8 { found = 1 } END { exit !found }'
}
if [ "$REDIS_REPLICAS" = 1 ]; then
    for i in 0 1 2; do
        m=${REDIS_MASTER_PORTS[$i]} r=${REDIS_REPLICA_PORTS[$i]}
        owns_nothing "$r" || continue
        id=$(master_id_of "$m")
        log "127.0.0.1:$r replicates 127.0.0.1:$m"
        replicate() { redis-cli -p "$r" cluster replicate "$id" | grep -q OK; }
        wait_for "$r to replicate $m" 20 replicate || die "127.0.0.1:$r cannot replicate node $id (see $STATE/logs/redis-$r.log)"
    done
fi
cluster_ok() {
    local p
    for p in "${WANTED[@]}"; do
        redis-cli -p "$p" cluster info | grep -q 'cluster_state:ok' || return 1
        if redis-cli -p "$p" info replication | grep -q 'role:slave'; then
            redis-cli -p "$p" info replication | grep -q 'master_link_status:up' || return 1
        fi
    done
}
wait_for "cluster ok" 60 cluster_ok || die "Redis Cluster is not healthy: redis-cli -p 7001 cluster nodes
  (a node this run does not start may serve slots after a failover: run with SECKILL_REDIS_REPLICAS=1, or
   start afresh with ./deploy/local/down.sh --purge)"

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

FLEET_PORTS=()
for d in stockd orderd gateway; do
    for ((k = 2; k <= FLEET; k++)); do FLEET_PORTS+=("$(fleet_port $d $k)" "$(fleet_admin_port $d $k)"); done
done
reserve_ports "${DAEMON_PORTS[@]}" "${REDIS_PORTS[@]}" "${FLEET_PORTS[@]}"

# The fleet's configs: the shipped file with the instance's ports (and, for the gateways,
# every instance as upstream), written to state/fleet/ and checked with -t before use.
mkdir -p "$STATE/fleet"
url_list() { # DAEMON: the TOML list of every instance's gRPC URL
    local k out=""
    for ((k = 1; k <= FLEET; k++)); do out="${out:+$out, }\"http://127.0.0.1:$(fleet_port "$1" "$k")\""; done
    echo "[$out]"
}
# replace FILE FROM TO: sed one whole line; fails naming it when the line is not there.
replace() {
    grep -qxF "$2" "$1" || die "$1: no line '$2' to replace: the shipped config changed; update up.sh"
    local from to
    from=$(printf '%s' "$2" | sed 's/[][\/.^$*]/\\&/g'); to=$(printf '%s' "$3" | sed 's/[\/&]/\\&/g')
    sed -i "s/^$from\$/$to/" "$1"
}
fleet_config() { # DAEMON K: prints the config path of instance K, writing it when generated
    local d=$1 k=$2 f
    if [ "$FLEET" = 1 ] || { [ "$k" = 1 ] && [ "$d" != gateway ]; }; then
        echo "$ROOT/deploy/local/$d.toml"; return
    fi
    f="$STATE/fleet/$(fleet_name "$d" "$k").toml"
    {
        echo "# Generated by deploy/local/up.sh --fleet $FLEET from deploy/local/$d.toml: instance $k."
        cat "$ROOT/deploy/local/$d.toml"
    } >"$f"
    case $d in
        stockd|orderd)
            replace "$f" "listen = \"127.0.0.1:$(fleet_port "$d" 1)\"" "listen = \"127.0.0.1:$(fleet_port "$d" "$k")\""
            replace "$f" "listen = \"127.0.0.1:$(fleet_admin_port "$d" 1)\"" "listen = \"127.0.0.1:$(fleet_admin_port "$d" "$k")\"" ;;
        gateway)
            replace "$f" 'listen = ["127.0.0.1:8080"]' "listen = [\"127.0.0.1:$(fleet_port gateway "$k")\"]"
            replace "$f" 'listen = "127.0.0.1:9091"' "listen = \"127.0.0.1:$(fleet_admin_port gateway "$k")\""
            sed -i "s|^pid_file = .*|pid_file = \"$STATE/fleet/gateway-$k.pid\"|; s|^upgrade_sock = .*|upgrade_sock = \"$STATE/fleet/gateway-$k-upgrade.sock\"|" "$f"
            sed -i "s|^stockd = .*|stockd = $(url_list stockd)|; s|^orderd = .*|orderd = $(url_list orderd)|" "$f"
            if ! "$BIN/gateway" -t -c "$f" >"$STATE/fleet/gateway-$k.check" 2>&1 \
                && grep -q 'upstreams' "$STATE/fleet/gateway-$k.check"; then
                # A gateway built before [upstreams] took lists: one instance of each.
                log "warning: $BIN/gateway takes one URL per upstream; gateway $k uses stockd $k and orderd $k only"
                sed -i "s|^stockd = .*|stockd = \"http://127.0.0.1:$(fleet_port stockd "$k")\"|; s|^orderd = .*|orderd = \"http://127.0.0.1:$(fleet_port orderd "$k")\"|" "$f"
            fi ;;
    esac
    "$BIN/$d" -t -c "$f" >"$STATE/fleet/$(fleet_name "$d" "$k").check" 2>&1 \
        || { cat "$STATE/fleet/$(fleet_name "$d" "$k").check" >&2; die "$f does not validate"; }
    echo "$f"
}

config_sig() { echo "$1 $(cksum <"$1")"; } # FILE: its path and checksum
daemon_up() { # daemon K health-path [flags...]
    local d=$1 k=$2 path=$3 name conf sig url p holder; shift 3
    name=$(fleet_name "$d" "$k")
    conf=$(fleet_config "$d" "$k")
    url="http://127.0.0.1:$(fleet_admin_port "$d" "$k")$path"
    # Running, healthy and on the same config (file and content): nothing to do. A stack
    # started before pids/NAME.conf existed ran the shipped file.
    sig=$(config_sig "$conf")
    if pid_alive "$name" \
        && [ "$(cat "$STATE/pids/$name.conf" 2>/dev/null || config_sig "$ROOT/deploy/local/$d.toml")" = "$sig" ] \
        && curl -fsS "$url" >/dev/null 2>&1; then return 0; fi
    stop_pid "$name"
    for p in "$(fleet_port "$d" "$k")" "$(fleet_admin_port "$d" "$k")"; do
        holder=$(port_holder "$p")
        [ -z "$holder" ] || die "$name cannot start: 127.0.0.1:$p is taken by $holder, which this stack did not start (a stack from another checkout? stop it with its own down.sh)"
        # A connection that got $p as its ephemeral port before the reservation above
        # blocks the bind until it closes, and a client's for its TIME-WAIT after (60 s).
        wait_port_free "$p" 90 || die "$name cannot start: 127.0.0.1:$p is held by a connection that does not close"
    done
    start_bg "$name" "$BIN/$d" -c "$conf" "$@"
    echo "$sig" >"$STATE/pids/$name.conf"
    wait_for "$name" 60 curl -fsS "$url" || { tail -n 20 "$STATE/logs/$name.log" >&2; die "$name did not become healthy"; }
}
# Instances beyond --fleet (from an earlier, larger run) stop first, the edge before the back.
for d in gateway orderd stockd; do
    for k in $(fleet_running "$d"); do [ "$k" -le "$FLEET" ] || stop_pid "$(fleet_name "$d" "$k")"; done
done
# A masters-only Redis has no replica to acknowledge a reservation or a stock return: stockd
# answers and orderd's relay marks a return done as soon as the master has it
# (redis.replica_acks = 0, unsafe with replicas; docs/stockd.md, docs/orderd.md).
if [ "$REDIS_REPLICAS" = 0 ]; then
    export STOCKD__REDIS__REPLICA_ACKS=0 ORDERD__REDIS__REPLICA_ACKS=0
fi
# stockd 1 applies the migrations (idempotent) before it serves.
daemon_up stockd 1 /healthz --migrate
for ((k = 2; k <= FLEET; k++)); do daemon_up stockd "$k" /healthz; done
for ((k = 1; k <= FLEET; k++)); do daemon_up orderd "$k" /healthz; done
for ((k = 1; k <= FLEET; k++)); do daemon_up gateway "$k" /readyz; done

redis_layout() { # one line per node: its role, and its slots or its master
    redis-cli -p 7001 cluster nodes | awk '
        { split($2, a, "@"); addr[$1] = a[1]; n++; id[n] = $1; flags[n] = $3; master[n] = $4
          slots[n] = ""; for (i = 9; i <= NF; i++) slots[n] = slots[n] " " $i }
        END { for (i = 1; i <= n; i++) {
            if (flags[i] ~ /master/) line = addr[id[i]] " master, slots" slots[i]
            else line = addr[id[i]] " replica of " addr[master[i]]
            if (flags[i] ~ /fail/) line = line " (failing)"
            print "                          " line } }' | sort
}
list_ports() { # DAEMON admin|grpc: instance addresses, comma-separated
    local k out=""
    for ((k = 1; k <= FLEET; k++)); do
        if [ "$2" = admin ]; then p=$(fleet_admin_port "$1" "$k"); else p=$(fleet_port "$1" "$k"); fi
        out="${out:+$out, }127.0.0.1:$p"
    done
    echo "$out"
}
cat <<MSG
The stack is up:
  web page and HTTP API   http://127.0.0.1:8080/          (OpenAPI: /api/openapi.json)
  gateway admin/metrics   http://127.0.0.1:9091/metrics   (/healthz, /readyz)
  stockd gRPC             127.0.0.1:50051                 (metrics http://127.0.0.1:9092/metrics)
  orderd gRPC             127.0.0.1:50052                 (metrics http://127.0.0.1:9093/metrics)
MSG
if [ "$FLEET" -gt 1 ]; then
    cat <<MSG
  fleet of $FLEET (configs in $STATE/fleet/):
    gateway HTTP          $(list_ports gateway grpc)
    gateway admin         $(list_ports gateway admin)
    stockd gRPC           $(list_ports stockd grpc)
    stockd admin          $(list_ports stockd admin)
    orderd gRPC           $(list_ports orderd grpc)
    orderd admin          $(list_ports orderd admin)
MSG
fi
echo "  Redis Cluster           ${WANTED[*]/#/127.0.0.1:}  (AOF everysec, cluster-node-timeout ${REDIS_NODE_TIMEOUT_MS} ms)"
redis_layout
cat <<MSG
  MariaDB                 $MYSQL_URL
  admin CLI               $BIN/seckillctl --help
  logs                    $STATE/logs/
Stop it with ./deploy/local/down.sh
MSG
