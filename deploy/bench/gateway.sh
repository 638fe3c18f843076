#!/usr/bin/env bash
# deploy/bench/gateway.sh — the gateway against the reference nginx + ngx_lua of
# ../shared/bench/reference (run-anchors.sh's nginx.conf.tmpl and lua/, used in place),
# in one go, 1 worker each, for the three answers the edge exists to give cheaply:
#   sold_out   ours: POST /api/v1/activities/1/items/7/reserve (item flagged sold out
#              from Redis; answered 410 before any JWT work)
#              nginx: GET /seckill-cached/1 (case B: lua_shared_dict-cached flag)
#              nginx_mget: GET /seckill/1 (case A: Redis MGET per request), second anchor
#   limited    ours: per-IP bucket 1/s burst 1 -> 429     nginx: /limited (limit_req 1r/s)
#   banned     ours: bans.deny = 127.0.0.0/8 -> 403       nginx: deny 127.0.0.0/8 -> 403
# Load: wrk -t1 -c64 -d10s --latency, RUNS runs, servers interleaved run by run,
# medians; ratio = ours / nginx (req/s: higher is better; latency and CPU: lower is).
# Then the memory case: RSS of the gateway after RSS_IPS distinct client IPs (sent as
# X-Forwarded-For from a trusted proxy, each one creating a per-IP bucket).
# Then the challenge cases (issue 14), each a ratio against OUR sold-out answer measured
# in the same runs, interleaved (anchor = the gateway's own 410, not nginx):
#   challenge_issue   POST .../items/8/challenge with a JWT: a signed puzzle (JWT check,
#                     one HMAC, one random draw; no Redis), answered in the fast lane;
#                     one token per connection, as a kept-alive client sends it, so the
#                     connection's verified-token memo answers the JWT check after the
#                     first request                                target >= 1.0x sold-out
#   challenge_issue_vs_soldout_jwt  the issue against the sold-out answer to a request
#                     carrying the same JWT header (a signed-in page sends it on every
#                     call): the same request bytes, so what differs is the work and the
#                     answer (a second anchor; the headline stays the header-less one)
#   challenge_issue_fresh_jwt  the same with 1,000 users' tokens taken in turn, so
#                     every request's JWT is new to its connection (a full check each)
#   challenge_redeem  POST .../items/8/token with a solved puzzle already spent: the full
#                     verification (JWT, MAC, 32 sub-solutions) and the one Redis
#                     SET NX that refuses it (409 challenge_replayed)
#
# Output: ${RESULTS_DIR:-results}/gateway.tsv (case ours anchor ratio unit), a table on
# stdout, raw wrk output under $WORK. Every process it starts is stopped by PID.
#
# Usage:  deploy/bench/gateway.sh                 (from the repo root)
# Knobs:  CASES="sold_out limited banned rss challenge room_beat"
#         QUIET_MAX=0.3 QUIET_WAIT=15 (per run: wait for an idle machine)
#         RUNS=3 DUR=10s CONNS=64 PIN=0 RSS_IPS=1000000 BUILD=1 DO_INSTALL=1 BENCH_TARGET=target/bench
#         REF=<path to shared/bench/reference> WORK=/tmp/gateway-bench
#         ACCESS_LOG=true (the gateway writes its access log, to $WORK/gateway.log; off like nginx's)
#         NEW_CONN=1 (wrk sends Connection: close: a connection per request, both sides; the
#         gateway's fast lane hands such a request to pingora, which answers and closes)
#         LIMITS_EXTRA='fleet = true' (TOML lines added to [limits] of the sold_out and
#         limited configs, e.g. to measure them with the fleet-shared budgets on)
#         PERF=1: perf record (cpu-clock, call graphs) of the server processes during each
#         run, to $WORK/perf-<run tag>-<pid>.data (`perf report -i <file>`); the
#         profiler's own cost lands in the figures of such a run
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REF=${REF:-$(cd "$ROOT/../shared/bench/reference" 2>/dev/null && pwd)}
WORK=${WORK:-/tmp/gateway-bench}
RESULTS_DIR=${RESULTS_DIR:-results}
RUNS=${RUNS:-3}
DUR=${DUR:-10s}
CONNS=${CONNS:-64}
PIN=${PIN:-0}
# NEW_CONN=1: every request on a connection of its own (wrk sends Connection: close and
# connects again), as a crowd of one-shot clients comes; both sides alike.
NEW_CONN=${NEW_CONN:-0}
WRK_EXTRA=(); [ "$NEW_CONN" = 1 ] && WRK_EXTRA=(-H "Connection: close")
RSS_IPS=${RSS_IPS:-1000000}
CASES=${CASES:-"sold_out limited banned rss challenge room_beat"}
LIMITS_EXTRA=${LIMITS_EXTRA:-}
want() { [[ " $CASES " == *" $1 "* ]]; }
BUILD=${BUILD:-1}
DO_INSTALL=${DO_INSTALL:-1}
REDIS_PORT=6390            # fixed by the reference lua (resp.lua)
NGX_PORT=8081; NGX_DENY_PORT=8082   # fixed by nginx.conf.tmpl
GW_PORT=${GW_PORT:-8193}; GW_ADMIN=${GW_ADMIN:-9193}
# A target dir of its own: a release build here never waits on the workspace's
# shared target/ lock (nor evicts its debug artifacts).
BENCH_TARGET=${BENCH_TARGET:-$ROOT/target/bench}
GW_BIN=$BENCH_TARGET/release/gateway
CLK_TCK=$(getconf CLK_TCK)
mkdir -p "$WORK" "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
TSV=$RESULTS_DIR/gateway.tsv

SRV_SET=(); CLI_SET=()
if [ "$PIN" = 1 ]; then SRV_SET=(taskset -c 0); CLI_SET=(taskset -c 1); fi
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

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
cleanup() { for p in "${PIDS[@]}"; do stop_pid "$p" TERM; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
    for _ in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
    log "port $1 did not open"; return 1
}

[ -n "$REF" ] && [ -f "$REF/nginx.conf.tmpl" ] || { log "reference setup not found (REF=$REF)"; exit 1; }

if [ "$DO_INSTALL" = 1 ]; then
    need=""
    command -v nginx >/dev/null || need+=" nginx"
    [ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || need+=" libnginx-mod-http-lua"
    command -v redis-server >/dev/null || need+=" redis-server"
    command -v redis-cli >/dev/null || need+=" redis-tools"
    command -v wrk >/dev/null || need+=" wrk"
    command -v curl >/dev/null || need+=" curl"
    if [ -n "$need" ]; then
        log "apt-get install$need"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >"$WORK/apt.log" 2>&1
    fi
fi
if [ "$BUILD" = 1 ]; then
    log "cargo build --release -p gateway"
    (cd "$ROOT" && CARGO_TARGET_DIR=$BENCH_TARGET cargo build --release -p gateway --bins >"$WORK/build.log" 2>&1) || { log "build failed: $WORK/build.log"; exit 1; }
fi

# ------------------------------------------------------------------ redis (both sides)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
REDIS_PID=$!; PIDS+=("$REDIS_PID")
wait_port "$REDIS_PORT" || exit 1
rcli() { redis-cli -p "$REDIS_PORT" "$@" >/dev/null; }
# nginx's keys (the reference seed): sku 1 sold out on 8 shards.
rcli MSET stock:1:0 0 stock:1:1 0 stock:1:2 0 stock:1:3 0 stock:1:4 0 stock:1:5 0 stock:1:6 0 stock:1:7 0
# ours (the seckill-lua key schema): activity 1, item 7, 8 shards, all empty, window open.
rcli SADD sk:activities 1
rcli HSET 'sk:{1}:meta' title bench start_ms 0 end_ms 4102444800000 shards 8 items 7 version 1 \
    stock:7 1000 title:7 phone price:7 19900
for i in 0 1 2 3 4 5 6 7; do rcli SET "sk:{1:$i}:stock:7" 0; done
# activity 2, item 8 on sale (stock on both shards), proof-of-work 14 bits x 32.
rcli SADD sk:activities 2
rcli HSET 'sk:{2}:meta' title bench2 start_ms 0 end_ms 4102444800000 shards 2 items 8 version 1 \
    stock:8 1000 title:8 tablet price:8 9900 challenge_bits 14
for i in 0 1; do rcli SET "sk:{2:$i}:stock:8" 500; done

# ------------------------------------------------------------------ nginx (1 worker)
NGX_DIR=$WORK/nginx
mkdir -p "$NGX_DIR"
sed -e "s|@WORKERS@|1|g" -e "s|@PREFIX@|$NGX_DIR|g" -e "s|@LUA_DIR@|$REF/lua|g" \
    "$REF/nginx.conf.tmpl" >"$NGX_DIR/nginx.conf"
nginx -t -q -p "$NGX_DIR/" -e "$NGX_DIR/error.log" -c "$NGX_DIR/nginx.conf" || { log "nginx -t failed"; exit 1; }
"${SRV_SET[@]}" nginx -p "$NGX_DIR/" -e "$NGX_DIR/error.log" -c "$NGX_DIR/nginx.conf" &
NGX_PID=$!; PIDS+=("$NGX_PID")
wait_port "$NGX_PORT" && wait_port "$NGX_DENY_PORT" || exit 1
sleep 0.5
NGX_KIDS=($(ps -o pid= --ppid "$NGX_PID"))
curl -s -o /dev/null "http://127.0.0.1:$NGX_PORT/limited"

# ------------------------------------------------------------------ gateway configs
gw_config() { # name, extra TOML appended
    local dead1=1 dead2=2 f=$WORK/gateway-$1.toml
    cat >"$f" <<TOML
[server]
listen = ["127.0.0.1:$GW_PORT"]
threads = 1
pid_file = "$WORK/gateway.pid"
upgrade_sock = "$WORK/gateway-upgrade.sock"
grace_period_secs = 0
graceful_shutdown_timeout_secs = 1
access_log = ${ACCESS_LOG:-false}
[admin]
listen = "127.0.0.1:$GW_ADMIN"
[redis]
nodes = ["127.0.0.1:$REDIS_PORT"]
cluster = false
refresh_ms = 1000
stock_poll_ms = 100
[upstreams]
stockd = "http://127.0.0.1:$dead1"
orderd = "http://127.0.0.1:$dead2"
service_token = "bench-token"
[auth]
jwt_secret = "bench-jwt-secret-0123456789"
purchase_token_secret = "bench-purchase-secret-0123456789"
$2
TOML
    echo "$f"
}
CFG_SOLD=$(gw_config sold_out '[limits]
per_ip = { rate = 1000000000.0, burst = 1000000000.0 }
'"$LIMITS_EXTRA"'
[bans]
auto_ban_threshold = 0')
CFG_LIMITED=$(gw_config limited '[limits]
per_ip = { rate = 1.0, burst = 1.0 }
'"$LIMITS_EXTRA"'
[bans]
auto_ban_threshold = 0')
CFG_BANNED=$(gw_config banned '[bans]
deny = ["127.0.0.0/8"]
auto_ban_threshold = 0')
# Worst case for memory: buckets that stay "not full" (rate 0.001/s) cannot be dropped
# losslessly, and max_tracked is above the flood, so every IP's bucket is held.
CFG_RSS=$(gw_config rss "[limits]
per_ip = { rate = 0.001, burst = 40.0 }
max_tracked = 2000000
idle_evict_secs = 3600
[bans]
trusted_proxies = [\"127.0.0.1\"]
auto_ban_threshold = 0")

GW_PID=""
start_gw() { # config, url, expected status
    "$GW_BIN" -t -c "$1" >/dev/null || { log "gateway -t failed for $1"; exit 1; }
    RUST_LOG=$([ "${ACCESS_LOG:-false}" = true ] && echo warn,access=info || echo warn) "${SRV_SET[@]}" "$GW_BIN" -c "$1" >>"$WORK/gateway.log" 2>&1 &
    GW_PID=$!; PIDS+=("$GW_PID")
    wait_port "$GW_PORT" || exit 1
    local code=""
    for _ in $(seq 100); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -X "${4:-GET}" "$2")
        [ "$code" = "$3" ] && return 0
        sleep 0.1
    done
    log "gateway check failed: $2 -> $code (want $3)"; exit 1
}

cpu_ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}'))); done; echo "$t"; }
parse_wrk() { # file -> rps p50_ms p99_ms requests
    awk 'function ms(v){ if (v ~ /us$/) { sub(/us$/,"",v); return v/1000 } if (v ~ /ms$/) { sub(/ms$/,"",v); return v+0 }
                         if (v ~ /s$/) { sub(/s$/,"",v); return v*1000 } return v+0 }
         /Requests\/sec:/ { rps = $2 } /^ +50% / { p50 = ms($2) } /^ +99% / { p99 = ms($2) } /requests in/ { n = $1 }
         END { printf "%s %.3f %.3f %d\n", rps, p50, p99, n }' "$1"
}
POST_LUA=$WORK/post.lua
echo 'wrk.method = "POST"' >"$POST_LUA"

one_run() { # tag url script pids... -> prints "rps p50 p99 us_per_req"
    local tag=$1 url=$2 script=$3; shift 3
    local f=$WORK/wrk-$tag.txt c0 c1 out n p perfs=()
    c0=$(cpu_ticks "$@")
    if [ "${PERF:-0}" = 1 ]; then
        for p in "$@"; do
            perf record -e cpu-clock -F "${PERF_FREQ:-999}" ${PERF_CG:--g} -p "$p" -o "$WORK/perf-$tag-$p.data" >/dev/null 2>&1 &
            perfs+=($!)
        done
    fi
    if [ -n "$script" ]; then
        "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d"$DUR" --latency "${WRK_EXTRA[@]}" -s "$script" "$url" >"$f" 2>&1
    else
        "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d"$DUR" --latency "${WRK_EXTRA[@]}" "$url" >"$f" 2>&1
    fi
    c1=$(cpu_ticks "$@")
    for p in "${perfs[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    out=$(parse_wrk "$f"); n=$(echo "$out" | awk '{print $4}')
    echo "$out" | awk -v c=$((c1 - c0)) -v hz="$CLK_TCK" '{ printf "%s %s %s %.2f\n", $1, $2, $3, ($4 > 0 ? c * 1e6 / hz / $4 : 0) }'
}
# Wait (up to QUIET_WAIT s) until the machine's other load is below QUIET_MAX cores, so
# that both servers are measured on a machine as idle as can be had.
QUIET_MAX=${QUIET_MAX:-0.3}; QUIET_WAIT=${QUIET_WAIT:-15}
busy_cores() {
    local a b
    a=$(awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat); sleep 1
    b=$(awk '/^cpu /{ b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat)
    awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN{ split(a, x, " "); split(b, y, " "); printf "%.2f", (y[1] - x[1]) / ((y[2] - x[2]) / n + 1e-9) }'
}
quiet_gate() {
    local waited=0 busy
    while :; do
        busy=$(busy_cores)
        awk -v b="$busy" -v m="$QUIET_MAX" 'BEGIN{ exit !(b < m) }' && return 0
        if [ "$waited" -ge "$QUIET_WAIT" ]; then log "machine still busy ($busy cores); measuring anyway"; return 0; fi
        waited=$((waited + 3)); sleep 2
    done
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2 }'; }

printf 'case\tours\tanchor\tratio\tunit\n' >"$TSV"
row() { # case ours anchor unit higher_is_better(1|0)
    local ratio
    ratio=$(awk -v o="$2" -v a="$3" 'BEGIN{ if (a > 0) printf "%.3f", o / a; else print "n/a" }')
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$ratio" "$4" >>"$TSV"
}

bench_case() { # name ours_url ours_script nginx_url nginx_pids_name
    local name=$1 ourl=$2 oscript=$3 nurl=$4
    local o_rps=() o_p50=() o_p99=() o_us=() n_rps=() n_p50=() n_p99=() n_us=() r
    "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d2s "$nurl" >/dev/null 2>&1
    if [ -n "$oscript" ]; then "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d2s -s "$oscript" "$ourl" >/dev/null 2>&1
    else "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d2s "$ourl" >/dev/null 2>&1; fi
    for r in $(seq "$RUNS"); do
        quiet_gate
        read -r a b c d < <(one_run "nginx-$name-$r" "$nurl" "" "${NGX_KIDS[@]}")
        n_rps+=("$a"); n_p50+=("$b"); n_p99+=("$c"); n_us+=("$d")
        quiet_gate
        read -r a b c d < <(one_run "ours-$name-$r" "$ourl" "$oscript" "$GW_PID")
        o_rps+=("$a"); o_p50+=("$b"); o_p99+=("$c"); o_us+=("$d")
        log "$name run $r: ours ${o_rps[-1]} req/s, nginx ${n_rps[-1]} req/s"
    done
    row "$name" "$(median "${o_rps[@]}")" "$(median "${n_rps[@]}")" "req/s"
    row "${name}_p50" "$(median "${o_p50[@]}")" "$(median "${n_p50[@]}")" "ms"
    row "${name}_p99" "$(median "${o_p99[@]}")" "$(median "${n_p99[@]}")" "ms"
    row "${name}_cpu" "$(median "${o_us[@]}")" "$(median "${n_us[@]}")" "us/req"
}

RESERVE_URL="http://127.0.0.1:$GW_PORT/api/v1/activities/1/items/7/reserve"
if want sold_out; then
    log "case sold_out"
    start_gw "$CFG_SOLD" "$RESERVE_URL" 410 POST
    bench_case sold_out "$RESERVE_URL" "$POST_LUA" "http://127.0.0.1:$NGX_PORT/seckill-cached/1"
    bench_case sold_out_vs_mget "$RESERVE_URL" "$POST_LUA" "http://127.0.0.1:$NGX_PORT/seckill/1"
    stop_pid "$GW_PID" INT
fi
if want limited; then
    log "case limited"
    start_gw "$CFG_LIMITED" "http://127.0.0.1:$GW_PORT/api/v1/activities" 429
    bench_case limited "http://127.0.0.1:$GW_PORT/api/v1/activities" "" "http://127.0.0.1:$NGX_PORT/limited"
    stop_pid "$GW_PID" INT
fi
if want banned; then
    log "case banned"
    start_gw "$CFG_BANNED" "http://127.0.0.1:$GW_PORT/api/v1/activities" 403
    bench_case banned "http://127.0.0.1:$GW_PORT/api/v1/activities" "" "http://127.0.0.1:$NGX_DENY_PORT/"
    stop_pid "$GW_PID" INT
fi
if want challenge; then
    log "case challenge"
    CFG_CHALLENGE=$(gw_config challenge '[limits]
per_ip = { rate = 1000000000.0, burst = 1000000000.0 }
per_user = { rate = 1000000000.0, burst = 1000000000.0 }
[bans]
auto_ban_threshold = 0
[challenge]
keys = [{ id = "bench", secret = "bench-challenge-secret-0123456789" }]')
    CH_URL="http://127.0.0.1:$GW_PORT/api/v1/activities/2/items/8/challenge"
    TOKEN_URL="http://127.0.0.1:$GW_PORT/api/v1/activities/2/items/8/token"
    start_gw "$CFG_CHALLENGE" "$RESERVE_URL" 410 POST
    # An HS256 JWT for "bench-user" (the config's jwt_secret), a day long.
    JWT=$(python3 - <<'PY'
import base64, hashlib, hmac, json, time
b = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
h = b(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
p = b(json.dumps({"sub": "bench-user", "exp": int(time.time()) + 86400}).encode())
s = b(hmac.new(b"bench-jwt-secret-0123456789", f"{h}.{p}".encode(), hashlib.sha256).digest())
print(f"{h}.{p}.{s}")
PY
)
    for _ in $(seq 50); do
        code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $JWT" "$CH_URL")
        [ "$code" = 200 ] && break; sleep 0.2
    done
    [ "$code" = 200 ] || { log "challenge issue answered $code"; exit 1; }
    # One puzzle, solved here, redeemed once (200): every later redeem is the full
    # verification refused by the single-use SET NX (409).
    BODY=$(curl -s -X POST -H "Authorization: Bearer $JWT" "$CH_URL" | python3 -c '
import hashlib, json, struct, sys
c = json.load(sys.stdin)
seed = bytes.fromhex(c["seed"])
def ok(i, n):
    h = int.from_bytes(hashlib.sha256(seed + struct.pack(">IQ", i, n)).digest()[:8], "big")
    return h >> (64 - c["bits"]) == 0
sol = []
for i in range(c["count"]):
    n = 0
    while not ok(i, n): n += 1
    sol.append(n)
print(json.dumps({"challenge": c["challenge"], "solutions": sol}))')
    first=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $JWT" \
        -H 'Content-Type: application/json' --data "$BODY" "$TOKEN_URL")
    again=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $JWT" \
        -H 'Content-Type: application/json' --data "$BODY" "$TOKEN_URL")
    [ "$first $again" = "200 409" ] || { log "redeem answered $first then $again (want 200 409)"; exit 1; }
    ISSUE_LUA=$WORK/issue.lua; REDEEM_LUA=$WORK/redeem.lua; FRESH_LUA=$WORK/issue-fresh.lua
    printf 'wrk.method = "POST"\nwrk.headers["Authorization"] = "Bearer %s"\n' "$JWT" >"$ISSUE_LUA"
    # 1,000 users' tokens, one per request in turn (wrk's one Lua state over all the
    # connections: a connection's next request carries another user's token).
    python3 - >"$FRESH_LUA" <<'PY'
import base64, hashlib, hmac, json, time
b = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
h = b(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
def jwt(user):
    p = b(json.dumps({"sub": user, "exp": int(time.time()) + 86400}).encode())
    s = b(hmac.new(b"bench-jwt-secret-0123456789", f"{h}.{p}".encode(), hashlib.sha256).digest())
    return f"{h}.{p}.{s}"
print("local headers = {")
for i in range(1000):
    print(f'  {{ ["Authorization"] = "Bearer {jwt(f"bench-user-{i}")}" }},')
print("}")
print("local i = 0")
print("request = function()")
print("  i = i % #headers + 1")
print('  return wrk.format("POST", nil, headers[i])')
print("end")
PY
    {
        printf 'wrk.method = "POST"\nwrk.headers["Authorization"] = "Bearer %s"\n' "$JWT"
        printf 'wrk.headers["Content-Type"] = "application/json"\nwrk.body = [[%s]]\n' "$BODY"
    } >"$REDEEM_LUA"
    s_rps=(); i_rps=(); r_rps=(); i_us=(); r_us=(); s_us=(); f_rps=(); f_us=(); sj_rps=(); sj_us=()
    for r in $(seq "$RUNS"); do
        quiet_gate; read -r a b c d < <(one_run "ch-sold-$r" "$RESERVE_URL" "$POST_LUA" "$GW_PID"); s_rps+=("$a"); s_us+=("$d")
        # The same sold-out answer to a signed-in buyer's request (the page sends its JWT
        # on every call): the same request bytes as the issue's, answered before any JWT work.
        quiet_gate; read -r a b c d < <(one_run "ch-soldjwt-$r" "$RESERVE_URL" "$ISSUE_LUA" "$GW_PID"); sj_rps+=("$a"); sj_us+=("$d")
        quiet_gate; read -r a b c d < <(one_run "ch-issue-$r" "$CH_URL" "$ISSUE_LUA" "$GW_PID"); i_rps+=("$a"); i_us+=("$d")
        quiet_gate; read -r a b c d < <(one_run "ch-fresh-$r" "$CH_URL" "$FRESH_LUA" "$GW_PID"); f_rps+=("$a"); f_us+=("$d")
        quiet_gate; read -r a b c d < <(one_run "ch-redeem-$r" "$TOKEN_URL" "$REDEEM_LUA" "$GW_PID"); r_rps+=("$a"); r_us+=("$d")
        log "challenge run $r: sold-out ${s_rps[-1]} (with a JWT ${sj_rps[-1]}), issue ${i_rps[-1]}, issue with fresh JWTs ${f_rps[-1]}, redeem ${r_rps[-1]} req/s"
    done
    for t in issue fresh; do
        grep -q 'Non-2xx' "$WORK/wrk-ch-$t-1.txt" && log "WARNING: challenge $t answered non-2xx (see $WORK/wrk-ch-$t-1.txt)"
    done
    row challenge_issue "$(median "${i_rps[@]}")" "$(median "${s_rps[@]}")" "req/s vs our sold-out"
    row challenge_issue_cpu "$(median "${i_us[@]}")" "$(median "${s_us[@]}")" "us/req vs our sold-out"
    row challenge_issue_vs_soldout_jwt "$(median "${i_rps[@]}")" "$(median "${sj_rps[@]}")" "req/s vs our sold-out to a request with the same JWT header"
    row challenge_issue_vs_soldout_jwt_cpu "$(median "${i_us[@]}")" "$(median "${sj_us[@]}")" "us/req vs the same"
    row challenge_issue_fresh_jwt "$(median "${f_rps[@]}")" "$(median "${s_rps[@]}")" "req/s vs our sold-out"
    row challenge_issue_fresh_jwt_cpu "$(median "${f_us[@]}")" "$(median "${s_us[@]}")" "us/req vs our sold-out"
    row challenge_redeem "$(median "${r_rps[@]}")" "$(median "${s_rps[@]}")" "req/s vs our sold-out"
    row challenge_redeem_cpu "$(median "${r_us[@]}")" "$(median "${s_us[@]}")" "us/req vs our sold-out"
    stop_pid "$GW_PID" INT
fi
# ------------------------------------------------------------------ waiting room: queued heartbeat
# One gateway with [room] method = "fifo" and the room of activity 1 paused (admin knob), so
# a heartbeat stays "waiting". Anchor: the sold-out reserve of the same process, runs
# interleaved; ratio = heartbeat / sold out (req/s). No Redis call on either path.
if want room_beat; then
    log "case room_beat"
    CFG_ROOM=$(gw_config room '[limits]
per_ip = { rate = 1000000000.0, burst = 1000000000.0 }
per_user = { rate = 1000000000.0, burst = 1000000000.0 }
[bans]
auto_ban_threshold = 0
[dev]
enabled = true
[room]
method = "fifo"
hold_secs = 3600
tick_ms = 100')
    start_gw "$CFG_ROOM" "$RESERVE_URL" 410 POST
    curl -s -o /dev/null -X POST "http://127.0.0.1:$GW_ADMIN/room/1" -H 'content-type: application/json' -d '{"paused": true}'
    for _ in $(seq 50); do curl -s "http://127.0.0.1:$GW_ADMIN/room/1" | grep -q '"paused":true' && break; sleep 0.1; done
    JWT=$(curl -s -X POST "http://127.0.0.1:$GW_PORT/api/v1/dev/token" -H 'content-type: application/json' \
        -d '{"user_id": "bench-queued"}' | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
    PLACE=$(curl -s -X POST "http://127.0.0.1:$GW_PORT/api/v1/activities/1/room/join" -H "authorization: Bearer $JWT" \
        | sed -n 's/.*"position_token":"\([^"]*\)".*/\1/p')
    [ -n "$PLACE" ] || { log "room join failed"; exit 1; }
    BEAT_URL="http://127.0.0.1:$GW_PORT/api/v1/activities/1/room/heartbeat"
    BEAT_LUA=$WORK/beat.lua
    cat >"$BEAT_LUA" <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $JWT"
wrk.headers["X-Room-Token"] = "$PLACE"
LUA
    state=$(curl -s -X POST "$BEAT_URL" -H "authorization: Bearer $JWT" -H "x-room-token: $PLACE" | sed -n 's/.*"state":"\([a-z_]*\)".*/\1/p')
    [ "$state" = waiting ] || { log "heartbeat answered state '$state', want waiting"; exit 1; }
    b_rps=(); b_p50=(); b_p99=(); b_us=(); s_rps=(); s_p50=(); s_p99=(); s_us=()
    "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d2s -s "$BEAT_LUA" "$BEAT_URL" >/dev/null 2>&1
    for r in $(seq "$RUNS"); do
        quiet_gate
        read -r a b c d < <(one_run "sold-anchor-$r" "$RESERVE_URL" "$POST_LUA" "$GW_PID")
        s_rps+=("$a"); s_p50+=("$b"); s_p99+=("$c"); s_us+=("$d")
        quiet_gate
        read -r a b c d < <(one_run "room-beat-$r" "$BEAT_URL" "$BEAT_LUA" "$GW_PID")
        b_rps+=("$a"); b_p50+=("$b"); b_p99+=("$c"); b_us+=("$d")
        log "room_beat run $r: heartbeat ${b_rps[-1]} req/s, sold out ${s_rps[-1]} req/s"
    done
    row room_beat "$(median "${b_rps[@]}")" "$(median "${s_rps[@]}")" "req/s (anchor: our sold out)"
    row room_beat_p50 "$(median "${b_p50[@]}")" "$(median "${s_p50[@]}")" "ms"
    row room_beat_p99 "$(median "${b_p99[@]}")" "$(median "${s_p99[@]}")" "ms"
    row room_beat_cpu "$(median "${b_us[@]}")" "$(median "${s_us[@]}")" "us/req"
    stop_pid "$GW_PID" INT
fi
want rss || { echo; column -t -s $'\t' "$TSV"; exit 0; }

# ------------------------------------------------------------------ memory: 1M client IPs
log "case rss: $RSS_IPS distinct client IPs"
start_gw "$CFG_RSS" "$RESERVE_URL" 410 POST
rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
RSS0=$(rss_kib "$GW_PID")
IPS_LUA=$WORK/ips.lua
cat >"$IPS_LUA" <<LUA
local i = 0
local limit = $RSS_IPS
-- wrk starts a fresh Lua state per run: the first argument is where the last run stopped.
init = function(args) i = tonumber(args[1]) or 0 end
request = function()
  i = i + 1
  if i > limit then i = 1 end
  local ip = string.format("10.%d.%d.%d", math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256)
  return wrk.format("POST", nil, { ["X-Forwarded-For"] = ip })
end
LUA
sent=0
while [ "$sent" -lt "$RSS_IPS" ]; do
    "${CLI_SET[@]}" wrk -t1 -c"$CONNS" -d10s -s "$IPS_LUA" "$RESERVE_URL" -- "$sent" >"$WORK/wrk-rss.txt" 2>&1
    n=$(awk '/requests in/{print $1}' "$WORK/wrk-rss.txt"); sent=$((sent + ${n:-0}))
    log "rss: $sent requests sent"
    [ "${n:-0}" -gt 0 ] || break
done
sleep 6   # the sweeper publishes gateway_tracked_ips every 5 s
TRACKED=$(curl -s "http://127.0.0.1:$GW_ADMIN/metrics" | awk '/^gateway_tracked_ips /{print $2}')
RSS1=$(rss_kib "$GW_PID")
stop_pid "$GW_PID" INT
row rss_after_ips "$(awk -v k="$RSS1" 'BEGIN{printf "%.1f", k/1024}')" 64 "MiB (anchor = target)"
row rss_baseline "$(awk -v k="$RSS0" 'BEGIN{printf "%.1f", k/1024}')" 64 "MiB before the flood"
row tracked_ips "${TRACKED:-0}" "$RSS_IPS" "buckets held / IPs sent"

echo
echo "gateway vs nginx+ngx_lua, 1 worker each, wrk -t1 -c$CONNS -d$DUR, $RUNS runs (medians), PIN=$PIN"
column -t -s $'\t' "$TSV"
echo
echo "TSV: $TSV   raw: $WORK"
echo "reproduce: RUNS=$RUNS DUR=$DUR PIN=$PIN RSS_IPS=$RSS_IPS deploy/bench/gateway.sh"
