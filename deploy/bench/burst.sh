#!/usr/bin/env bash
# deploy/bench/burst.sh — where the opening burst's `reserved` latency goes (issue 15, item 2).
# Runs deploy/local/demo.sh (its default crowd unless flags are given; they are passed on) on the
# local stack and splits the crowd's `reserved` answers into the stages the daemons measure,
# from /metrics scraped just before and just after the crowd:
#   crowd      the crowd's own report (request sent -> answer read, in the crowd's runtime)
#   edge       gateway_request_duration_seconds{outcome="reserved"}: request header read ->
#              answer written, in the gateway
#   hop        gateway_upstream_call_seconds{service="stockd"}: the gRPC call as the edge sees
#              it (the channel's queue and HTTP/2 included)
#   stockd     stockd_reserve_seconds: the whole Reserve handler (queueing for the shard's
#              group-commit call included)
#   batch      stockd_reserve_batch_rpc_seconds: one edge ReserveBatch call as a whole (its
#              slowest entry: every entry of the batch waits for it)
#   lua        stockd_lua_seconds{script="reserve"}: one EVALSHA (with its WAIT when acked)
#   ack        stockd_replica_ack_seconds: the pipeline's WAIT for a replica
#   wait       stockd_rebalance_wait_seconds: a reservation whose home shard was empty, waiting
#              for a rebalancing round (its turn, or the round that carried it)
#   round      stockd_rebalance_round_seconds: one rebalancing round (read, takes, gives, look)
#   outcomes   stockd_rebalance_round_outcomes_total: rounds that moved units home, found them
#              only elsewhere (the callers reserve again), or found the item sold out
#              (printed with the moves), and stockd_rebalance_elsewhere_total: what the look
#              of an `elsewhere` round found (units on the shards, enough only with those in
#              transit, or units moving during the look)
#   looks      stockd_sold_out_looks_total: looks at every shard of an item (a GET and one
#              look call per shard) by rounds, by the check after a shard emptied, and by
#              buyers out of attempts (printed with the moves, with those buyers:
#              stockd_reserve_gave_up_total, told to retry while units remained), and the
#              look and reserve calls sent to Redis (stockd_lua_seconds_count)
#   empties    stockd_rebalance_waits_per_reserved: how many times a reservation answered
#              RESERVED found its home shard empty (rounds waited for or run), when it did
# Then the opening itself, in 25 ms slices of the crowd's send time (its --answers-tsv,
# kept in $OUT/answers.tsv; deploy/bench/opening.py): which answers were slow, and when.
# The gap crowd - edge is time outside the gateway's handler: the client's own scheduling, the
# kernel's socket queues and the gateway's event loop before it reads the request. Also the
# CPU seconds of each process over the run (who had the 2 cores).
#
# Usage: deploy/bench/burst.sh [demo.sh flags]     (brings the stack up with up.sh first)
# Env: SKIP_UP=1 (the stack is already up; SKIP_BUILD=1 is passed to demo.sh then).
#      TIMELINE=1: every process's CPU (and the crowd's) sampled every 250 ms over the run, to
#      $OUT/timeline.tsv (t_s name cpu_ms_in_the_interval): who had the cores at the opening.
#      PERF=1: perf record (cpu-clock) of the gateway over the run, to $OUT/perf-gateway.data.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$ROOT/deploy/local/lib.sh"
HERE=$ROOT/deploy/bench
OUT=${OUT:-/tmp/burst-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
[ "${SKIP_UP:-0}" = 1 ] || "$ROOT/deploy/local/up.sh" || die "up.sh failed"
scrape() { curl -fsS "http://127.0.0.1:9091/metrics" >"$OUT/gateway-$1.prom"; curl -fsS "http://127.0.0.1:9092/metrics" >"$OUT/stockd-$1.prom"; }
pids() { for f in "$STATE"/pids/*.pid; do p=$(cat "$f"); [ -r "/proc/$p/stat" ] && echo "$(basename "$f" .pid) $p"; done; }
ticks() { pids | while read -r n p; do echo "$n $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')"; done; }
scrape before
ticks >"$OUT/cpu-before.txt"
t0=$(date +%s.%N)
CROWD_ANSWERS_TSV=$OUT/answers.tsv SKIP_BUILD=1 "$ROOT/deploy/local/demo.sh" --no-up --out "$OUT/demo" "$@" >"$OUT/demo.log" 2>&1 &
demo=$!
side=()
if [ "${PERF:-0}" = 1 ] && [ -r "$STATE/pids/gateway.pid" ]; then
    perf record -e cpu-clock -F "${PERF_FREQ:-999}" -g -p "$(cat "$STATE/pids/gateway.pid")" -o "$OUT/perf-gateway.data" >/dev/null 2>&1 &
    side+=($!)
fi
if [ "${TIMELINE:-0}" = 1 ]; then
    # Per 250 ms: each daemon's CPU ticks, and the crowd's (the process named crowd); turned
    # into ms per interval after the run. One python3 process reads /proc: the earlier bash
    # loop forked a dozen processes per sample and took half a core during the opening.
    python3 - "$demo" "$STATE/pids" >"$OUT/timeline-raw.txt" 2>/dev/null <<'PY' &
import os, sys, time
demo, piddir = int(sys.argv[1]), sys.argv[2]
procs = {}
for f in os.listdir(piddir):
    if f.endswith(".pid"):
        try:
            procs[f[:-4]] = int(open(os.path.join(piddir, f)).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
def ticks(pid):
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
crowd = None
while os.path.exists(f"/proc/{demo}"):
    now = time.time()
    if crowd is None:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if open(f"/proc/{d}/comm").read().strip() == "crowd":
                        crowd = int(d)
                        break
                except OSError:
                    pass
    for name, pid in list(procs.items()) + ([("crowd", crowd)] if crowd else []):
        try:
            print(f"{now:.3f} {name} {pid} {ticks(pid)}")
        except (OSError, IndexError, ValueError):
            pass
    sys.stdout.flush()
    time.sleep(0.25)
PY
    side+=($!)
fi
wait "$demo"
rc=$?
for p in "${side[@]}"; do kill -INT "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
if [ -s "$OUT/timeline-raw.txt" ]; then
    awk -v t0="$t0" -v hz="$(getconf CLK_TCK)" '{ k = $2 " " $3; if (k in last) printf "%.2f\t%s\t%.0f\n", $1 - t0, $2, ($4 - last[k]) * 1000 / hz; last[k] = $4 }' \
        "$OUT/timeline-raw.txt" >"$OUT/timeline.tsv"
    echo "CPU timeline (ms per 250 ms sample): $OUT/timeline.tsv"
fi
t1=$(date +%s.%N)
ticks >"$OUT/cpu-after.txt"
scrape after
child=$(sed 's/^.*) //' "/proc/$$/stat" | awk '{print $14 + $15}')
echo "demo.sh exit $rc, log $OUT/demo.log"
echo
echo "crowd's own report (reserved and all answers):"
grep -E "^ *(kind|reserved|all) " "$OUT/demo.log" | head -3
echo
if [ -s "$OUT/answers.tsv" ]; then
    echo "the opening, by the crowd's send time (every answer: $OUT/answers.tsv):"
    python3 "$HERE/opening.py" "$OUT/answers.tsv" 25 400
    echo
fi
echo "stages, from the daemons' histograms over the crowd's run:"
python3 "$HERE/hist-diff.py" "$OUT/gateway-before.prom" "$OUT/gateway-after.prom" gateway_request_duration_seconds 'outcome="reserved"'
python3 "$HERE/hist-diff.py" "$OUT/gateway-before.prom" "$OUT/gateway-after.prom" gateway_upstream_call_seconds 'service="stockd"'
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_reserve_seconds
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_reserve_batch_rpc_seconds
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_lua_seconds 'script="reserve"'
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_replica_ack_seconds
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_reserve_batch_size
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_rebalance_wait_seconds
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_rebalance_round_seconds
python3 "$HERE/hist-diff.py" "$OUT/stockd-before.prom" "$OUT/stockd-after.prom" stockd_rebalance_waits_per_reserved
# The end of the sale over the run: the buyers' rebalancing rounds, the takes (one Lua call
# and a replica WAIT each) and the units moved.
counter() { awk -v m="$1" '$1 == m { v = $2 } END { print v + 0 }' "$2"; }
moves=""
for m in stockd_rebalance_rounds_total stockd_rebalance_rereads_total 'stockd_lua_seconds_count{script="take"}' stockd_rebalance_units_total \
    'stockd_rebalance_round_outcomes_total{outcome="home"}' 'stockd_rebalance_round_outcomes_total{outcome="elsewhere"}' \
    'stockd_rebalance_elsewhere_total{found="shards"}' 'stockd_rebalance_elsewhere_total{found="transit"}' \
    'stockd_rebalance_elsewhere_total{found="moving"}' stockd_rebalance_takes_empty_total stockd_rebalance_landing_waits_total \
    'stockd_rebalance_round_outcomes_total{outcome="sold_out"}' 'stockd_sold_out_looks_total{by="round"}' \
    'stockd_sold_out_looks_total{by="check"}' 'stockd_sold_out_looks_total{by="attempts"}' \
    'stockd_lua_seconds_count{script="look"}' 'stockd_lua_seconds_count{script="reserve"}' \
    stockd_reserve_gave_up_total; do
    moves+=" ${m}=$(( $(counter "$m" "$OUT/stockd-after.prom") - $(counter "$m" "$OUT/stockd-before.prom") ))"
done
echo "moves:$moves"
echo
hz=$(getconf CLK_TCK)
echo "CPU over the demo ($(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}') s wall, 2 cores = $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", 2 * (b - a)}') cpu-s):"
join <(sort "$OUT/cpu-before.txt") <(sort "$OUT/cpu-after.txt") | awk -v hz="$hz" '{ printf "  %-16s %6.2f cpu-s\n", $1, ($3 - $2) / hz }'
awk -v c="$child" -v hz="$hz" 'BEGIN{ printf "  %-16s %6.2f cpu-s (demo.sh, seckillctl, crowd)\n", "children", c / hz }'
echo "files: $OUT"
exit $rc
