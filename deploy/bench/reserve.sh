#!/usr/bin/env bash
# deploy/bench/reserve.sh — the winners' path end to end (issue 15, item 1): HTTP POST reserve
# through the gateway (valid JWT + purchase token per simulated user) -> gRPC -> stockd ->
# Redis, against the OpenResty anchor of ../shared/bench/reference (nginx.conf.tmpl location
# /reserve/{sku}?u=<user>&r=<request id>: reserve-anchor.lua by EVALSHA on the user's home
# shard, in nginx itself, no application tier).
#
# Same Redis for both sides: one Redis Cluster master owning every slot (the anchor's RESP
# client speaks to one node) with one replica, AOF everysec on both (no automatic
# rewrite: it landed in random rounds), like a shard of the local
# stack. Same load tool (wrk -t1 -cCONNS, one Lua script handing out requests prepared before
# the run: distinct users, a fresh user per request, JWTs and purchase tokens signed outside
# the timed window), same concurrency, stock large enough that nothing sells out. The anchor's
# RESP client pools max(64, CONNS) Redis connections (it ships with 64: past that it would
# connect per request). docs/load-testing.md has the ratio at 32 to 256 connections.
#
# stockd is measured in both settings of redis.replica_acks, each behind its own gateway:
#   acks0  replica_acks = 0: answers once the master has it. Like with like (the anchor does
#          not WAIT either): the HEADLINE ratio.
#   acks1  replica_acks = 1 (the shipped default): one WAIT per pipeline of group-committed
#          calls; a reservation is answered only once the replica holds it.
# Rounds are interleaved (anchor, acks0, acks1, anchor, ...); medians over RUNS rounds.
# CPU per reservation per process from /proc (gateway, stockd, redis master, redis replica,
# nginx worker), over the timed window; wrk's own CPU inside its clock (replay.lua reads it).
#
# Output: ${RESULTS_DIR:-results}/reserve.tsv (case ours anchor ratio unit), the per-process CPU
# table reserve_cpu.tsv, a table on stdout, raw wrk output under $WORK. Every process it
# starts is stopped by PID.
#
# Usage:  deploy/bench/reserve.sh            (from the repo root; release build into target/bench)
# Knobs:  RUNS=5 DUR=10s CONNS=64 ACKS="0 1" USERS_PER_SEC=45000 (requests prepared per second
#         of DUR; a run that used them all up is flagged) SHARDS=8 BUILD=1 DO_INSTALL=1
#         BENCH_TARGET=target/bench BIN_DIR=<dir with gateway, stockd, seckillctl>
#         QUIET_MAX=0.3 QUIET_WAIT=15 (per run: wait for an idle machine)
#         REDIS_ONLY=1 REDIS_BATCHES="1 4 8" REDIS_CLIENTS=8 REDIS_ONLY_N=200000: after the rounds,
#         the two reservation scripts against the same Redis with nothing in front
#         (redis-benchmark; rows redis_only_*): Redis's CPU per reservation, ours at B per call
#         against the anchor's one per call
#         PERF=1: perf record (cpu-clock, call graphs) of every server process during each
#         run, to $WORK/perf-<side>-<round>-<process>-<pid>.data (`perf report -i <file>`);
#         the profiler's own cost lands in the figures of such a run
#         REDIS_PORT=6390 REPLICA_PORT=6391 NGX_PORT=8081 NGX_DENY_PORT=8082 (fixed ports outside SMOKE)
#         SECKILL_TEST_MYSQL_URL (MariaDB server; default mysql://root@127.0.0.1:3306)
#         SMOKE=1: one short round on free ports, no quiet gate, BUILD=0 (the test suite runs
#         it with debug binaries: tests/tests/reserve_bench.rs); checks that every request
#         of both sides was answered 202.
#         REF=<path to shared/bench/reference> WORK=/tmp/reserve-bench
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/deploy/bench
REF=${REF:-$(cd "$ROOT/../shared/bench/reference" 2>/dev/null && pwd)}
SMOKE=${SMOKE:-0}
WORK=${WORK:-/tmp/reserve-bench}
RESULTS_DIR=${RESULTS_DIR:-results}
if [ "$SMOKE" = 1 ]; then
    RUNS=${RUNS:-1}; DUR=${DUR:-1s}; CONNS=${CONNS:-8}; USERS_PER_SEC=${USERS_PER_SEC:-40000}
    BUILD=${BUILD:-0}; QUIET_WAIT=${QUIET_WAIT:-0}; DO_INSTALL=${DO_INSTALL:-1}
else
    RUNS=${RUNS:-5}; DUR=${DUR:-10s}; CONNS=${CONNS:-64}; USERS_PER_SEC=${USERS_PER_SEC:-45000}
    BUILD=${BUILD:-1}; QUIET_WAIT=${QUIET_WAIT:-15}; DO_INSTALL=${DO_INSTALL:-1}
fi
QUIET_MAX=${QUIET_MAX:-0.3}
REDIS_ONLY=${REDIS_ONLY:-1}; REDIS_BATCHES=${REDIS_BATCHES:-"1 4 8"}; REDIS_CLIENTS=${REDIS_CLIENTS:-8}
if [ "$SMOKE" = 1 ]; then REDIS_ONLY_N=${REDIS_ONLY_N:-2000}; else REDIS_ONLY_N=${REDIS_ONLY_N:-200000}; fi
PERF=${PERF:-0}   # PERF_CG="--call-graph dwarf" for call chains through code without frame pointers
ACKS=${ACKS:-"0 1"}
SHARDS=${SHARDS:-8}
BENCH_TARGET=${BENCH_TARGET:-$ROOT/target/bench}
BIN_DIR=${BIN_DIR:-$BENCH_TARGET/release}
MYSQL_SERVER=${SECKILL_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306}
MYSQL_SERVER=${MYSQL_SERVER%/}
CLK_TCK=$(getconf CLK_TCK)
JWT_SECRET=bench-jwt-secret-0123456789
PT_SECRET=bench-purchase-secret-0123456789
SKU=1          # the anchor's item
mkdir -p "$WORK" "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TSV=$RESULTS_DIR/reserve.tsv
CPU_TSV=$RESULTS_DIR/reserve_cpu.tsv
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
die() { log "$*"; exit 1; }
secs() { local d=$1; case $d in *ms) echo "scale=3; ${d%ms}/1000" | bc ;; *s) echo "${d%s}" ;; *m) echo $((${d%m} * 60)) ;; *) echo "$d" ;; esac; }

PIDS=()
stop_pid() {
    local p=$1 sig=${2:-TERM}
    kill -0 "$p" 2>/dev/null || return 0
    kill "-$sig" "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    return 0
}
DB=""
cleanup() {
    local i
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[$i]}" TERM; done
    [ -n "$DB" ] && mysql_q "DROP DATABASE IF EXISTS \`$DB\`" 2>/dev/null
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# alive PID: the process runs (an exited child not yet reaped is a zombie: kill -0 still
# succeeds on it, so the state is read instead).
alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [[ -n $st && $st != Z* ]]; }
# wait_port PORT [PID LOG]: until PORT accepts; with PID, gives up as soon as that process
# has exited, and names PORT, the process and the end of LOG (a CI run shows nothing else).
# Without the PID check a dead server's port is polled for 30 s, and a poll from an
# ephemeral source port equal to PORT connects to itself (TCP simultaneous open) and
# passes.
wait_port() {
    for _ in $(seq 300); do
        [ -n "${2:-}" ] && ! alive "$2" && break
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    if [ -n "${2:-}" ]; then
        alive "$2" && log "port $1 did not open within 30 s (pid $2 still running)" \
            || log "port $1 did not open: pid $2 exited"
        [ -n "${3:-}" ] && [ -f "$3" ] && { log "last lines of $3:"; tail -n 20 "$3" >&2; }
    else
        log "port $1 did not open"
    fi
    return 1
}
# free_ports N: N distinct ports free right now (all held open at once while picked). A port
# can still be taken between this and the listener's bind: the starts below retry on a new one.
free_ports() {
    python3 -c 'import socket,sys
ss=[socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1",0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}
free_port() { free_ports 1; }
# free_redis_ports N: N distinct ports for Redis Cluster nodes: each and its bus port (+10000)
# free right now, and at most 55535 (a node on a higher port exits at once: "Redis port
# number too high"); drawn from 20000-31999, below Linux's ephemeral range, so no outgoing
# connection holds one.
free_redis_ports() {
    python3 -c 'import random,socket,sys
n=int(sys.argv[1]); got=[]; held=[]
for _ in range(2000):
    if len(got)==n: break
    p=random.randrange(20000,32000)
    if p in got: continue
    try:
        a=socket.socket(); a.bind(("127.0.0.1",p)); b=socket.socket(); b.bind(("127.0.0.1",p+10000))
    except OSError: continue
    held+=[a,b]; got.append(p)
if len(got)<n: sys.exit("no free Redis ports")
print(" ".join(map(str,got)))' "$1"
}
# replace FILE FROM TO: one whole line of a copied shipped config; fails naming it when absent.
replace() {
    grep -qxF "$2" "$1" || die "$1: no line '$2' to replace: the shipped config changed; update reserve.sh"
    local from to
    from=$(printf '%s' "$2" | sed 's/[][\/.^$*]/\\&/g'); to=$(printf '%s' "$3" | sed 's/[\/&]/\\&/g')
    sed -i "s/^$from\$/$to/" "$1"
}

[ -n "$REF" ] && [ -f "$REF/nginx.conf.tmpl" ] && [ -f "$REF/lua/reserve.lua" ] \
    || die "reference setup not found (REF=$REF)"

if [ "$DO_INSTALL" = 1 ]; then
    need=""
    command -v nginx >/dev/null || need+=" nginx"
    [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || need+=" libnginx-mod-http-lua"
    command -v redis-server >/dev/null || need+=" redis-server"
    command -v redis-cli >/dev/null || need+=" redis-tools"
    command -v wrk >/dev/null || need+=" wrk"
    command -v curl >/dev/null || need+=" curl"
    command -v bc >/dev/null || need+=" bc"
    command -v mariadb >/dev/null || need+=" mariadb-client"
    if [ -n "$need" ]; then
        log "apt-get install$need"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq $need; } >"$WORK/apt.log" 2>&1 \
            || die "apt-get install$need failed: $WORK/apt.log"
    fi
fi
if [ "$BUILD" = 1 ]; then
    log "cargo build --release -p gateway -p stockd (target $BENCH_TARGET)"
    (cd "$ROOT" && CARGO_TARGET_DIR=$BENCH_TARGET cargo build --release -p gateway -p stockd --bins >"$WORK/build.log" 2>&1) \
        || die "build failed: $WORK/build.log"
fi
for b in gateway stockd seckillctl; do [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b is missing"; done

# ------------------------------------------------------------------ ports
# Every port of the run comes from one pick, so no two are the same: nginx starts first, and a
# gateway port picked apart from nginx's could be one nginx then took; the gateway's bind
# fails, its port answers anyway (nginx's), and the check meets nginx's 403 (seen once in CI).
read -r -a PICKED < <(free_ports $((2 + 4 * $(wc -w <<<"$ACKS"))))
if [ "$SMOKE" = 1 ]; then
    read -r REDIS_PORT REPLICA_PORT < <(free_redis_ports 2)
    NGX_PORT=${PICKED[0]}; NGX_DENY_PORT=${PICKED[1]}
else
    REDIS_PORT=${REDIS_PORT:-6390}; REPLICA_PORT=${REPLICA_PORT:-6391}; NGX_PORT=${NGX_PORT:-8081}; NGX_DENY_PORT=${NGX_DENY_PORT:-8082}
fi
declare -A GW_PORT GW_ADMIN SD_PORT SD_ADMIN
i=2
for k in $ACKS; do
    GW_PORT[$k]=${PICKED[$i]}; GW_ADMIN[$k]=${PICKED[$((i + 1))]}
    SD_PORT[$k]=${PICKED[$((i + 2))]}; SD_ADMIN[$k]=${PICKED[$((i + 3))]}
    i=$((i + 4))
done

# ------------------------------------------------------------------ redis: 1 master (all slots) + 1 replica
redis_node() { # VAR: the name of the variable holding its port (moved to a new port on a retry)
    local var=$1 port d pid try
    for try in 1 2 3; do
        port=${!var}; d=$WORK/redis-$port
        rm -rf "$d"; mkdir -p "$d"
        # No automatic AOF rewrite: the log grows by every reservation of every round, and a
        # rewrite (a fork and a pass over the data, ~0.3 cpu-s) landed in whichever round
        # crossed the size threshold, anchor's or ours. The appends themselves stay.
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 5000 --appendonly yes --appendfsync everysec --save '' --daemonize no \
            --auto-aof-rewrite-percentage 0 --dir "$d" --logfile "$d/redis.log" &
        pid=$!
        if wait_port "$port" "$pid" "$d/redis.log"; then PIDS+=("$pid"); return 0; fi
        stop_pid "$pid" KILL
        [ "$SMOKE" = 1 ] || break   # fixed ports: say so and stop
        printf -v "$var" '%s' "$(free_redis_ports 1)"; log "redis-server: retrying on port ${!var}"
    done
    die "redis-server did not start ($var)"
}
redis_node REDIS_PORT; REDIS_PID=${PIDS[-1]}
redis_node REPLICA_PORT; REPLICA_PID=${PIDS[-1]}
rc() { redis-cli -p "$REDIS_PORT" "$@"; }
rc cluster addslotsrange 0 16383 >/dev/null
redis-cli -p "$REPLICA_PORT" cluster meet 127.0.0.1 "$REDIS_PORT" >/dev/null
MASTER_ID=$(rc cluster myid)
for _ in $(seq 100); do
    redis-cli -p "$REPLICA_PORT" cluster replicate "$MASTER_ID" 2>/dev/null | grep -q OK && break
    sleep 0.2
done
cluster_ok() {
    rc cluster info | grep -q 'cluster_state:ok' && redis-cli -p "$REPLICA_PORT" cluster info | grep -q 'cluster_state:ok' \
        && rc info replication | grep -q 'connected_slaves:1' \
        && redis-cli -p "$REPLICA_PORT" info replication | grep -q 'master_link_status:up'
}
for _ in $(seq 150); do cluster_ok && break; sleep 0.2; done
cluster_ok || die "Redis master $REDIS_PORT + replica $REPLICA_PORT not healthy"
# The anchor's keys: {sk:<sku>:<shard>}:stock, 8 shards (reserve.lua), stock that never runs out.
for i in 0 1 2 3 4 5 6 7; do rc SET "{sk:$SKU:$i}:stock" 1000000000 >/dev/null; done

# ------------------------------------------------------------------ nginx anchor (1 worker)
NGX_DIR=$WORK/nginx
rm -rf "$NGX_DIR"; mkdir -p "$NGX_DIR/lua"
cp "$REF"/lua/*.lua "$NGX_DIR/lua/"
# The anchor as shipped, on this run's ports (its RESP client and listeners are fixed ones).
sed -i "s/local HOST, PORT = \"127.0.0.1\", 6390/local HOST, PORT = \"127.0.0.1\", $REDIS_PORT/" "$NGX_DIR/lua/resp.lua"
grep -q "\"127.0.0.1\", $REDIS_PORT" "$NGX_DIR/lua/resp.lua" || die "could not point resp.lua at port $REDIS_PORT"
# Its keepalive pool holds 64 Redis connections: past 64 concurrent requests nginx would
# connect and close one per request, a handicap of the setting and not of the design. Give it
# one pooled connection per wrk connection (stockd keeps one connection per node whatever the
# load).
ANCHOR_POOL=$(( CONNS > 64 ? CONNS : 64 ))
sed -i "s/local POOL_SIZE, IDLE_MS, TIMEOUT_MS = 64,/local POOL_SIZE, IDLE_MS, TIMEOUT_MS = $ANCHOR_POOL,/" "$NGX_DIR/lua/resp.lua"
grep -q "POOL_SIZE, IDLE_MS, TIMEOUT_MS = $ANCHOR_POOL," "$NGX_DIR/lua/resp.lua" || die "could not set resp.lua's pool to $ANCHOR_POOL"
NGX_PID=""
for try in 1 2 3; do
    sed -e "s|@WORKERS@|1|g" -e "s|@PREFIX@|$NGX_DIR|g" -e "s|@LUA_DIR@|$NGX_DIR/lua|g" \
        -e "s|127.0.0.1:8081|127.0.0.1:$NGX_PORT|" -e "s|127.0.0.1:8082|127.0.0.1:$NGX_DENY_PORT|" \
        "$REF/nginx.conf.tmpl" >"$NGX_DIR/nginx.conf"
    nginx -t -q -p "$NGX_DIR/" -e "$NGX_DIR/error.log" -c "$NGX_DIR/nginx.conf" || die "nginx -t failed"
    nginx -p "$NGX_DIR/" -e "$NGX_DIR/error.log" -c "$NGX_DIR/nginx.conf" &
    NGX_PID=$!
    if wait_port "$NGX_PORT" "$NGX_PID" "$NGX_DIR/error.log"; then PIDS+=("$NGX_PID"); break; fi
    stop_pid "$NGX_PID" KILL; NGX_PID=""
    [ "$SMOKE" = 1 ] || break
    read -r NGX_PORT NGX_DENY_PORT < <(free_ports 2); log "nginx: retrying on ports $NGX_PORT $NGX_DENY_PORT"
done
[ -n "$NGX_PID" ] || die "nginx did not start"
sleep 0.3
NGX_KIDS=($(ps -o pid= --ppid "$NGX_PID"))
code=$(curl -s -o "$WORK/anchor-check.json" -w '%{http_code}' "http://127.0.0.1:$NGX_PORT/reserve/$SKU?u=check&r=check")
[ "$code" = 202 ] || die "anchor check: /reserve/$SKU -> $code $(cat "$WORK/anchor-check.json")"

# ------------------------------------------------------------------ MariaDB, stockd, gateway per setting
DB=seckill_rbench_$$
mysql_q() {
    local u=${MYSQL_SERVER#mysql://} user host port
    user=${u%%@*}; host=${u#*@}; port=3306
    case $host in *:*) port=${host##*:}; host=${host%%:*} ;; esac
    mariadb -h"$host" -P"$port" -u"$user" -N -e "$1" 2>&1 | grep -v '^$' || true
}
case ${MYSQL_SERVER#mysql://} in *:*@*) die "a MariaDB URL with a password is not supported here" ;; esac
mysql_q "CREATE DATABASE \`$DB\`" | grep -q . && die "cannot create database $DB on $MYSQL_SERVER"

declare -A SD_PID GW_PID
for k in $ACKS; do
    f=$WORK/stockd-acks$k.toml
    cp "$ROOT/deploy/local/stockd.toml" "$f"
    replace "$f" 'listen = "127.0.0.1:50051"' "listen = \"127.0.0.1:${SD_PORT[$k]}\""
    replace "$f" 'listen = "127.0.0.1:9092"' "listen = \"127.0.0.1:${SD_ADMIN[$k]}\""
    replace "$f" 'nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]' "nodes = [\"127.0.0.1:$REDIS_PORT\"]"
    replace "$f" 'replica_acks = 1' "replica_acks = $k"
    replace "$f" 'url = "mysql://root@127.0.0.1:3306/seckill"' "url = \"$MYSQL_SERVER/$DB\""
    "$BIN_DIR/stockd" -t -c "$f" >/dev/null || die "stockd -t failed for $f"
    RUST_LOG=warn "$BIN_DIR/stockd" -c "$f" --migrate >>"$WORK/stockd-acks$k.log" 2>&1 &
    SD_PID[$k]=$!; PIDS+=("${SD_PID[$k]}")
    wait_port "${SD_PORT[$k]}" "${SD_PID[$k]}" "$WORK/stockd-acks$k.log" || die "stockd acks$k did not start"
done
FIRST=$(echo $ACKS | awk '{print $1}')

cat >"$WORK/activity.toml" <<TOML
title = "reserve bench"
start_at = "now"
end_at = "now+2h"
shard_count = $SHARDS
per_user_limit = 1

[[items]]
title = "bench item"
price_cents = 1000
sale_price_cents = 500
stock = 100000000
TOML
CREATED=$("$BIN_DIR/seckillctl" --stockd "http://127.0.0.1:${SD_PORT[$FIRST]}" --json activity create \
    --file "$WORK/activity.toml" --publish) || die "seckillctl activity create failed: $CREATED"
ACTIVITY=$(echo "$CREATED" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
ITEM=$(echo "$CREATED" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["items"][0]["id"])')
log "activity $ACTIVITY item $ITEM: 100,000,000 units on $SHARDS shards"

for k in $ACKS; do
    f=$WORK/gateway-acks$k.toml
    cp "$ROOT/deploy/local/gateway.toml" "$f"
    replace "$f" 'listen = ["127.0.0.1:8080"]' "listen = [\"127.0.0.1:${GW_PORT[$k]}\"]"
    replace "$f" 'listen = "127.0.0.1:9091"' "listen = \"127.0.0.1:${GW_ADMIN[$k]}\""
    replace "$f" 'pid_file = "/tmp/seckill-gateway.pid"' "pid_file = \"$WORK/gateway-acks$k.pid\""
    replace "$f" 'upgrade_sock = "/tmp/seckill-gateway-upgrade.sock"' "upgrade_sock = \"$WORK/gateway-acks$k-upgrade.sock\""
    # Like the anchor: no access log (nginx runs with access_log off).
    replace "$f" 'access_log = true' 'access_log = false'
    replace "$f" 'nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]' "nodes = [\"127.0.0.1:$REDIS_PORT\"]"
    replace "$f" 'stockd = "http://127.0.0.1:50051"' "stockd = \"http://127.0.0.1:${SD_PORT[$k]}\""
    replace "$f" 'jwt_secret = "local-dev-jwt-secret-change-me"' "jwt_secret = \"$JWT_SECRET\""
    replace "$f" 'purchase_token_secret = "local-dev-purchase-token-secret"' "purchase_token_secret = \"$PT_SECRET\""
    # Every request comes from 127.0.0.1: limits far above the load (the anchor's limit_req
    # zone is 1,000,000 r/s), no automatic bans.
    replace "$f" 'per_ip = { rate = 20.0, burst = 40.0 }' 'per_ip = { rate = 1000000000.0, burst = 1000000000.0 }'
    replace "$f" 'reserve = { rate = 20000.0, burst = 40000.0 }' 'reserve = { rate = 1000000000.0, burst = 1000000000.0 }'
    replace "$f" 'auto_ban_threshold = 200' 'auto_ban_threshold = 0'
    "$BIN_DIR/gateway" -t -c "$f" >/dev/null || die "gateway -t failed for $f"
    RUST_LOG=warn "$BIN_DIR/gateway" -c "$f" >>"$WORK/gateway-acks$k.log" 2>&1 &
    GW_PID[$k]=$!; PIDS+=("${GW_PID[$k]}")
    wait_port "${GW_PORT[$k]}" "${GW_PID[$k]}" "$WORK/gateway-acks$k.log" || die "gateway acks$k did not start"
done

# ------------------------------------------------------------------ requests (prepared outside the timed window)
GEN=$HERE/gen-reserve-requests.py
DUR_S=$(secs "$DUR")
PER_RUN=$(awk -v d="$DUR_S" -v r="$USERS_PER_SEC" 'BEGIN{ printf "%d", d * r + 1000 }')
gen() { # side prefix n file
    if [ "$1" = anchor ]; then
        python3 "$GEN" anchor "$2" "$3" "127.0.0.1:$NGX_PORT" "$SKU" >"$4"
    else
        python3 "$GEN" ours "$2" "$3" "127.0.0.1:${GW_PORT[$1]}" "$ACTIVITY" "$ITEM" "$JWT_SECRET" "$PT_SECRET" >"$4"
    fi
}
WRK_LUA=$WORK/replay.lua
cat >"$WRK_LUA" <<'LUA'
-- Hands out the prepared requests (one per line, CRLF written as TAB), each once.
-- os.clock() is the process's CPU time (every thread): printed once the file is loaded
-- (init runs before wrk starts its clock) and again in done, so the run's own cost is the
-- difference, without the load.
local reqs, n, i = {}, 0, 0
local function load(path)
  for l in io.lines(path) do n = n + 1; reqs[n] = l:gsub("\t", "\r\n") end
end
-- The machine's "cpu" line of /proc/stat is printed at the same two points: how busy the
-- cores were while wrk's clock ran.
local function mark(what)
  local f = io.open("/proc/stat"); local cpu = f and f:read("*l") or "cpu"; if f then f:close() end
  io.write(string.format("wrk_cpu_%s %.6f %s\n", what, os.clock(), cpu))
end
init = function(args) load(args[1]); mark("after_init") end
done = function() mark("at_done") end
request = function()
  i = i + 1
  if i > n then i = 1 end   -- wrapped: duplicates follow (flagged by the non-202 count)
  return reqs[i]
end
LUA
# Each side's endpoint answers 202 to a fresh user (checked once here, before any run).
for k in $ACKS; do
    gen "$k" "check$k-" 1 "$WORK/check.req"
    auth=$(tr '\t' '\n' <"$WORK/check.req" | sed -n 's/^Authorization: //p')
    body=$(tr '\t' '\n' <"$WORK/check.req" | tail -1)
    got=""
    for _ in $(seq 100); do
        got=$(curl -s -o "$WORK/ours-check.json" -w '%{http_code}' -X POST -H "Authorization: $auth" \
            -H 'Content-Type: application/json' -d "$body" \
            "http://127.0.0.1:${GW_PORT[$k]}/api/v1/activities/$ACTIVITY/items/$ITEM/reserve")
        [ "$got" = 202 ] && break
        sleep 0.2
    done
    [ "$got" = 202 ] || die "gateway acks$k check: reserve -> $got $(cat "$WORK/ours-check.json")"
done
log "both sides answer 202; preparing $PER_RUN requests per run"

# ------------------------------------------------------------------ measurement
cpu_ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done; echo "$t"; }
# sched_sums pid... -> "sleeps runq_wait_ns": over every thread of the processes, the times a
# thread went to sleep (voluntary context switches: each is a wake-up later) and the time it
# was runnable but waited for a core (schedstat's second field).
sched_sums() {
    local p
    for p in "$@"; do cat /proc/"$p"/task/*/status /proc/"$p"/task/*/schedstat 2>/dev/null; done |
        awk '/^voluntary_ctxt_switches:/ { v += $2; next } NF == 3 && $1 ~ /^[0-9]+$/ { w += $2 } END { printf "%d %d\n", v, w }'
}
parse_wrk() { # file -> rps p50_ms p99_ms requests non2xx wrk_cpu_s busy_cores (inside wrk's clock: replay.lua)
    awk -v ncpu="$(nproc)" 'function ms(v){ if (v ~ /us$/) { sub(/us$/,"",v); return v/1000 } if (v ~ /ms$/) { sub(/ms$/,"",v); return v+0 }
                         if (v ~ /s$/) { sub(/s$/,"",v); return v*1000 } return v+0 }
         /Requests\/sec:/ { rps = $2 } /^ +50% / { p50 = ms($2) } /^ +99% / { p99 = ms($2) } /requests in/ { n = $1 }
         /Non-2xx or 3xx responses:/ { bad = $5 }
         /Socket errors:/ { s = $0; gsub(/[^0-9]+/, " ", s); k = split(s, a, " "); for (j = 1; j <= k; j++) bad += a[j] }
         function busy(  b, t, j) { b = 0; t = 0; for (j = 4; j <= 11 && j <= NF; j++) { t += $j; if (j != 7 && j != 8) b += $j } return b " " t }
         /^wrk_cpu_after_init / { c0 = $2; split(busy(), x0, " "); m++ } /^wrk_cpu_at_done / { c1 = $2; split(busy(), x1, " "); m++ }
         END { cores = (m == 2 && x1[2] > x0[2] ? (x1[1] - x0[1]) / (x1[2] - x0[2]) * ncpu : 0)   # 0: marks missing
               printf "%s %.3f %.3f %d %d %.6f %.2f\n", rps, p50, p99, n, bad, (m == 2 ? c1 - c0 : 0), cores }' "$1"
}
busy_cores() {
    local a b
    a=$(awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat); sleep 1
    b=$(awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat)
    awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN{ split(a, x, " "); split(b, y, " "); printf "%.2f", (y[1] - x[1]) / ((y[2] - x[2]) / n + 1e-9) }'
}
quiet_gate() {
    [ "$QUIET_WAIT" -gt 0 ] || return 0
    local waited=0 busy
    while :; do
        busy=$(busy_cores)
        awk -v b="$busy" -v m="$QUIET_MAX" 'BEGIN{ exit !(b < m) }' && return 0
        if [ "$waited" -ge "$QUIET_WAIT" ]; then log "machine still busy ($busy cores); measuring anyway"; return 0; fi
        waited=$((waited + 3)); sleep 2
    done
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2 }'; }

# The metrics of the side's gateway and stockd, before (0) and after (1) a run.
scrape() { # side run 0|1
    curl -fsS "http://127.0.0.1:${GW_ADMIN[$1]}/metrics" >"$WORK/metrics-$1-$2-$3-gateway.txt" 2>/dev/null
    curl -fsS "http://127.0.0.1:${SD_ADMIN[$1]}/metrics" >"$WORK/metrics-$1-$2-$3-stockd.txt" 2>/dev/null
}
# mean side run process series [scale] -> the mean of a histogram over the run, from the two
# scrapes (sum and count deltas, times scale: 1000 shows seconds as ms); "-" when it saw nothing.
mean() {
    local w=$WORK/metrics-$1-$2 name=${4%%\{*} labels=""; [ "$name" = "$4" ] || labels="{${4#*\{}"
    awk -v a="${name}_sum$labels " -v b="${name}_count$labels " -v k="${5:-1000}" 'FNR == 1 { f++ } index($0, a) == 1 { sm[f] = $2 } index($0, b) == 1 { c[f] = $2 }
        END { d = c[2] - c[1]; if (d > 0) printf "%.3f", (sm[2] - sm[1]) / d * k; else printf "-" }' "$w-0-$3.txt" "$w-1-$3.txt"
}
# Where a reservation's time went: the mean of each latency histogram over the run.
stages() { # side run
    local m="mean $1 $2"
    log "  round $2 acks$1 means (ms): gateway reserved $($m gateway 'gateway_request_duration_seconds{outcome="reserved"}')," \
        "gateway -> stockd call $($m gateway 'gateway_upstream_call_seconds{service="stockd"}')," \
        "stockd reserve $($m stockd stockd_reserve_seconds), Redis reserve call $($m stockd 'stockd_lua_seconds{script="reserve"}');" \
        "$($m stockd stockd_reserve_stream_entries 1) reservations per stream message"
}
# What the Redis master ran over a run, per reservation: each command's calls and the
# microseconds Redis counted for it (INFO commandstats before and after; the commands a
# script calls are counted both under their own name and inside the script's).
redis_commands() { # side run reservations
    local n=${3:-0} name=$1; [ "$1" = anchor ] || name="acks$1"
    [ "$n" -gt 0 ] || return 0
    awk -F'[:=,]' -v n="$n" 'FNR == 1 { f++ } /^cmdstat_/ { k = substr($1, 9); c[f, k] = $3; u[f, k] = $5; seen[k] = 1 }
        END { for (k in seen) { dc = c[2, k] - c[1, k]; if (dc > 0) printf "%s %.3f calls %.2f us, ", k, dc / n, (u[2, k] - u[1, k]) / n } }' \
        "$WORK/cmdstats-$1-$2-0.txt" "$WORK/cmdstats-$1-$2-1.txt" |
        sed 's/, $//' | { read -r line; log "  round $2 $name Redis master per reservation: $line"; }
}
# one_run side run -> "rps p50 p99 requests bad us_front us_stockd us_master us_replica us_wrk per_call busy_cores sleeps runq_us" (the last two per reservation, servers only)
# (front = the gateway, or the nginx worker for the anchor; stockd = 0 for the anchor)
one_run() {
    local side=$1 r=$2 reqf=$WORK/req-$1-$2.txt f=$WORK/wrk-$1-$2.txt url front stockd=()
    gen "$side" "$side-r$r-" "$PER_RUN" "$reqf"
    if [ "$side" = anchor ]; then url="http://127.0.0.1:$NGX_PORT/"; front=("${NGX_KIDS[@]}")
    else url="http://127.0.0.1:${GW_PORT[$side]}/"; front=("${GW_PID[$side]}"); stockd=("${SD_PID[$side]}"); fi
    quiet_gate
    local f0 s0 m0 r0 f1 s1 m1 r1 perfs=() p pc=1
    [ "$side" = anchor ] || scrape "$side" "$r" 0
    rc info commandstats >"$WORK/cmdstats-$side-$r-0.txt" 2>/dev/null
    # wrk reads the request file in init, before its clock starts; its column is the CPU it
    # used after that (replay.lua prints the process's CPU time at both ends).
    f0=$(cpu_ticks "${front[@]}"); s0=$(cpu_ticks "${stockd[@]}"); m0=$(cpu_ticks "$REDIS_PID"); r0=$(cpu_ticks "$REPLICA_PID")
    local z0 z1; z0=$(sched_sums "${front[@]}" "${stockd[@]}" "$REDIS_PID" "$REPLICA_PID")
    if [ "$PERF" = 1 ]; then  # a CPU profile of each server process of the side, over the run
        for p in "${front[@]}" "${stockd[@]}" "$REDIS_PID"; do
            perf record -e cpu-clock -F "${PERF_FREQ:-499}" ${PERF_CG:--g} -p "$p" -o "$WORK/perf-$side-$r-$(cat /proc/$p/comm)-$p.data" >/dev/null 2>&1 &
            perfs+=($!)
        done
    fi
    wrk -t1 -c"$CONNS" -d"$DUR" --latency -s "$WRK_LUA" "$url" -- "$reqf" >"$f" 2>&1
    f1=$(cpu_ticks "${front[@]}"); s1=$(cpu_ticks "${stockd[@]}"); m1=$(cpu_ticks "$REDIS_PID"); r1=$(cpu_ticks "$REPLICA_PID")
    z1=$(sched_sums "${front[@]}" "${stockd[@]}" "$REDIS_PID" "$REPLICA_PID")
    for p in "${perfs[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rc info commandstats >"$WORK/cmdstats-$side-$r-1.txt" 2>/dev/null
    if [ "$side" != anchor ]; then
        scrape "$side" "$r" 1; stages "$side" "$r" >&2
        pc=$(mean "$side" "$r" stockd stockd_reserve_batch_size 1); [ "$pc" = - ] && pc=1
    fi
    rm -f "$reqf"
    local parsed; parsed=$(parse_wrk "$f")
    redis_commands "$side" "$r" "$(awk '{print $4}' <<<"$parsed")" >&2
    awk -v pc="$pc" -v hz="$CLK_TCK" -v f=$((f1 - f0)) -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v r=$((r1 - r0)) -v z0="$z0" -v z1="$z1" \
        '{ n = ($4 > 0 ? $4 : 1); u = 1e6 / hz / n; split(z0, za, " "); split(z1, zb, " ");
           printf "%s %s %s %s %s %.2f %.2f %.2f %.2f %.2f %.2f %s %.2f %.2f\n", $1, $2, $3, $4, $5, f * u, s * u, m * u, r * u, $6 * 1e6 / n, pc, $7, (zb[1] - za[1]) / n, (zb[2] - za[2]) / 1000 / n }' <<<"$parsed"
}

SIDES="anchor"; for k in $ACKS; do SIDES+=" $k"; done
declare -A COL
for s in $SIDES; do for c in rps p50 p99 bad front stockd master replica wrk pc cores sleeps runq; do COL[$s.$c]=""; done; done
# Warm-up: connections, JIT, the script cache, both sides.
for s in $SIDES; do
    gen "$s" "$s-warm-" 5000 "$WORK/req-warm.txt"
    url="http://127.0.0.1:$NGX_PORT/"; [ "$s" = anchor ] || url="http://127.0.0.1:${GW_PORT[$s]}/"
    wrk -t1 -c"$CONNS" -d1s -s "$WRK_LUA" "$url" -- "$WORK/req-warm.txt" >/dev/null 2>&1
done
for r in $(seq "$RUNS"); do
    for s in $SIDES; do
        read -r rps p50 p99 n bad uf us um ur uw pc cores sl rq < <(one_run "$s" "$r")
        if [ "$n" -gt "$PER_RUN" ]; then
            # Past the prepared requests wrk starts over: those resends are duplicates (409)
            # by design; only the rest count as wrong answers.
            log "  round $r $s used up its $PER_RUN prepared requests ($n sent): raise USERS_PER_SEC"
            bad=$((bad - (n - PER_RUN))); [ "$bad" -ge 0 ] || bad=0
        fi
        COL[$s.rps]+=" $rps"; COL[$s.p50]+=" $p50"; COL[$s.p99]+=" $p99"; COL[$s.bad]+=" $bad"
        COL[$s.front]+=" $uf"; COL[$s.stockd]+=" $us"; COL[$s.master]+=" $um"; COL[$s.replica]+=" $ur"; COL[$s.wrk]+=" $uw"; COL[$s.pc]+=" $pc"; COL[$s.cores]+=" $cores"; COL[$s.sleeps]+=" $sl"; COL[$s.runq]+=" $rq"
        name=$s; [ "$s" = anchor ] || name="ours acks$s"
        log "round $r $name: $rps req/s p50 $p50 ms p99 $p99 ms, $n requests, $bad not 202, $pc per call, $cores cores busy, $sl sleeps and $rq us waiting for a core per reservation"
    done
done
med() { median ${COL[$1]}; }
# ------------------------------------------------------------------ Redis alone (REDIS_ONLY=1)
# The reservation scripts against the same master + replica with no tier in front: the anchor's
# reserve-anchor.lua (one reservation per call) and our lua/scripts/reserve.lua carrying B
# reservations per call, as stockd's group commit sends them (B in REDIS_BATCHES), driven by
# redis-benchmark (-c REDIS_CLIENTS, distinct random users and request ids) on keys of their
# own. Per reservation: the master's and the replica's CPU (/proc) and the time Redis counted
# executing the script (INFO commandstats, I/O and parsing left out). What group commit saves
# Redis, apart from the gateway, stockd and the load tool.
redis_only() {
    local b n=$REDIS_ONLY_N sha_a sha_o keys args j tp=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
    sha_a=$(rc script load "$(cat "$REF/lua/reserve-anchor.lua")") || die "redis-only: script load failed"
    sha_o=$(rc script load "$(cat "$ROOT/lua/scripts/reserve.lua")") || die "redis-only: script load failed"
    # Our script's state for activity 9 item 2 shard 0 (fence = epoch "e1"); the anchor's SKU 9.
    rc set '{sk:9:0}:stock' 1000000000 >/dev/null
    rc mset 'sk:{9:0}:fence' e1 'sk:{9:0}:stock:2' 1000000000 >/dev/null
    redis_only_case anchor 1 "$n" evalsha "$sha_a" 3 '{sk:9:0}:stock' '{sk:9:0}:buyers' '{sk:9:0}:orders' \
        u__rand_int__ r__rand_int__ 1764900000000
    for b in $REDIS_BATCHES; do
        keys=(); args=(9 0 1764900000000 e1 0)
        for j in $(seq "$b"); do
            keys+=('sk:{9:0}:stock:2' 'sk:{9:0}:buyers:2')
            args+=(2 u__rand_int__ r__rand_int__ "$tp" 1)
        done
        redis_only_case "b$b" "$b" $(( (n + b - 1) / b )) evalsha "$sha_o" $((3 + 2 * b)) \
            'sk:{9:0}:fence' 'sk:{9:0}:seq' 'sk:{9:0}:orders' "${keys[@]}" "${args[@]}"
    done
}
# redis_only_case name reservations_per_call calls command... -> appends "name master replica exec" to $WORK/redis-only.txt
redis_only_case() {
    local name=$1 per=$2 calls=$3 m0 r0 m1 r1 e0 e1 xl0 xl1 stream='{sk:9:0}:orders'; shift 3
    [ "$name" = anchor ] || stream='sk:{9:0}:orders'
    quiet_gate
    xl0=$(rc xlen "$stream"); e0=$(rc info commandstats | awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $5 }')
    m0=$(cpu_ticks "$REDIS_PID"); r0=$(cpu_ticks "$REPLICA_PID")
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$REDIS_CLIENTS" -n "$calls" -r 1000000000 -q "$@" \
        >"$WORK/redis-only-$name.txt" 2>&1
    # The replica's share of the run reaches it a little after the master's.
    sleep 0.5
    m1=$(cpu_ticks "$REDIS_PID"); r1=$(cpu_ticks "$REPLICA_PID")
    e1=$(rc info commandstats | awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $5 }'); xl1=$(rc xlen "$stream")
    grep -q 'ERR' "$WORK/redis-only-$name.txt" && die "redis-only $name: Redis answered an error ($WORK/redis-only-$name.txt)"
    local res=$((xl1 - xl0))
    # Random users repeat now and then (a duplicate appends nothing): nearly every call reserves.
    [ "$res" -ge $(( calls * per * 95 / 100 )) ] || die "redis-only $name: $res reservations appended for $((calls * per)) sent"
    awk -v n="$res" -v hz="$CLK_TCK" -v m=$((m1 - m0)) -v r=$((r1 - r0)) -v e="$((${e1:-0} - ${e0:-0}))" -v name="$name" \
        'BEGIN { printf "%s %.2f %.2f %.2f\n", name, m * 1e6 / hz / n, r * 1e6 / hz / n, e / n }' >>"$WORK/redis-only.txt"
}
sum_bad() { echo ${COL[$1]} | tr ' ' '\n' | awk '{s += $1} END{print s + 0}'; }

printf 'case\tours\tanchor\tratio\tunit\n' >"$TSV"
row() { # case ours anchor unit
    local ratio
    ratio=$(awk -v o="$2" -v a="$3" 'BEGIN{ if (a > 0) printf "%.3f", o / a; else print "n/a" }')
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$ratio" "$4" >>"$TSV"
}
printf 'side\tgateway_or_nginx\tstockd\tredis_master\tredis_replica\tserver_total\twrk\tbusy_cores\tsleeps\trunq_wait\tunit\n' >"$CPU_TSV"
for k in $ACKS; do
    tag=acks$k; [ "$k" = 0 ] && tag="acks0_headline"
    row "reserve_$tag" "$(med "$k.rps")" "$(med anchor.rps)" "reservations/s"
    # The median of the per-round ratios: each round's two figures are seconds apart, so this
    # one is the least moved by other load on the machine (the rows above are medians per side).
    rr=$(median $(paste <(echo ${COL[$k.rps]} | tr ' ' '\n') <(echo ${COL[anchor.rps]} | tr ' ' '\n') \
        | awk '$2 > 0 { printf "%.3f\n", $1 / $2 }'))
    printf '%s\t%s\t%s\t%s\t%s\n' "reserve_${tag}_round_ratio" "$rr" 1 "$rr" "median of per-round ratios (ours / anchor req/s)" >>"$TSV"
    row "reserve_${tag}_p50" "$(med "$k.p50")" "$(med anchor.p50)" "ms"
    row "reserve_${tag}_p99" "$(med "$k.p99")" "$(med anchor.p99)" "ms"
    ours_tot=$(awk -v a="$(med "$k.front")" -v b="$(med "$k.stockd")" -v c="$(med "$k.master")" -v d="$(med "$k.replica")" 'BEGIN{printf "%.2f", a+b+c+d}')
    anc_tot=$(awk -v a="$(med anchor.front)" -v c="$(med anchor.master)" -v d="$(med anchor.replica)" 'BEGIN{printf "%.2f", a+c+d}')
    row "reserve_${tag}_server_cpu" "$ours_tot" "$anc_tot" "us/reservation (edge+stockd+redis)"
    row "reserve_${tag}_redis_cpu" "$(awk -v c="$(med "$k.master")" -v d="$(med "$k.replica")" 'BEGIN{printf "%.2f", c+d}')" \
        "$(awk -v c="$(med anchor.master)" -v d="$(med anchor.replica)" 'BEGIN{printf "%.2f", c+d}')" "us/reservation (master+replica)"
    row "reserve_${tag}_per_call" "$(med "$k.pc")" 1 "reservations per Redis reserve call (anchor: 1)"
    row "reserve_${tag}_not_202" "$(sum_bad "$k.bad")" "$(sum_bad anchor.bad)" "answers (all rounds)"
done
if [ "$REDIS_ONLY" = 1 ]; then
    log "Redis alone: the anchor's script and ours at $REDIS_BATCHES reservations per call, $REDIS_ONLY_N reservations each"
    : >"$WORK/redis-only.txt"
    redis_only
    read -r _ am ar ae < <(grep '^anchor ' "$WORK/redis-only.txt")
    for b in $REDIS_BATCHES; do
        read -r _ om or oe < <(grep "^b$b " "$WORK/redis-only.txt")
        row "redis_only_b${b}_master_cpu" "$om" "$am" "us/reservation, master (our script, $b per call / the anchor's, 1 per call)"
        row "redis_only_b${b}_replica_cpu" "$or" "$ar" "us/reservation, replica"
        row "redis_only_b${b}_script_exec" "$oe" "$ae" "us/reservation Redis counted executing the script (commandstats)"
    done
fi
for s in $SIDES; do
    name=anchor_nginx; [ "$s" = anchor ] || name="ours_acks$s"
    tot=$(awk -v a="$(med "$s.front")" -v b="$(med "$s.stockd")" -v c="$(med "$s.master")" -v d="$(med "$s.replica")" 'BEGIN{printf "%.2f", a+b+c+d}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$(med "$s.front")" "$(med "$s.stockd")" "$(med "$s.master")" \
        "$(med "$s.replica")" "$tot" "$(med "$s.wrk")" "$(med "$s.cores")" "$(med "$s.sleeps")" "$(med "$s.runq")" "us/reservation (median); cores of $(nproc) busy; server threads' sleeps and us runnable without a core, per reservation" >>"$CPU_TSV"
done

echo
echo "reserve through the edge vs nginx+ngx_lua reserving in Redis itself: wrk -t1 -c$CONNS -d$DUR, $RUNS interleaved rounds (medians)"
echo "Redis: 1 cluster master (all slots) + 1 replica, AOF everysec; $SHARDS shards; gateway threads=1, nginx 1 worker"
echo "headline: acks0 (stockd replica_acks = 0, no WAIT, like the anchor); acks1 = the shipped default (WAIT 1 per pipeline)"
column -t -s $'\t' "$TSV"
echo
echo "CPU per reservation by process (us, medians over rounds):"
column -t -s $'\t' "$CPU_TSV"
for s in $SIDES; do echo "rounds $s req/s:${COL[$s.rps]}"; done
echo
echo "TSV: $TSV $CPU_TSV   raw: $WORK"
echo "reproduce: RUNS=$RUNS DUR=$DUR CONNS=$CONNS ACKS=\"$ACKS\" REDIS_ONLY=$REDIS_ONLY REDIS_BATCHES=\"$REDIS_BATCHES\" deploy/bench/reserve.sh"
if [ "$SMOKE" = 1 ]; then
    for s in $SIDES; do
        [ "$(sum_bad "$s.bad")" = 0 ] || die "smoke: side $s had answers other than 202 (see $WORK/wrk-$s-*.txt)"
        [ "$(med "$s.rps" | awk '{print ($1 > 0)}')" = 1 ] || die "smoke: side $s served nothing"
    done
    log "smoke: every request of every side was answered 202"
fi
exit 0
