#!/usr/bin/env bash
# The one bench entry point: runs every benchmark of the project, each next to its anchor (the
# reference setups of ../shared/bench/ for the gateway, the bare Lua script for stockd, ...), then
# prints ONE table of ratios from their TSVs.
#
#   deploy/bench/run.sh                 # all of them
#   deploy/bench/run.sh gateway stockd  # a subset, by name
#   RESULTS_DIR=/tmp/bench deploy/bench/run.sh
#
# Each deploy/bench/<name>.sh writes ${RESULTS_DIR}/<name>.tsv with the header
# `case<TAB>ours<TAB>anchor<TAB>ratio<TAB>unit` (ratio = ours / anchor, so > 1 is better for a
# throughput and worse for a latency: read the unit). A missing script is skipped with a note; a
# failing one is reported and the others still run. Exit status: non-zero when any script failed.
# Compare ratios from one run, never absolute figures from different runs (see
# ../shared/bench/README.md: figures move 10-20% between runs on these machines).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export RESULTS_DIR=${RESULTS_DIR:-$ROOT/results/bench-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RESULTS_DIR"

if [ $# -gt 0 ]; then NAMES=("$@"); else NAMES=(stockd orderd gateway reserve idle); fi

declare -A STATUS
failed=0
for name in "${NAMES[@]}"; do
    script="$HERE/$name.sh"
    if [ ! -f "$script" ]; then
        echo "== $name: skipped ($script does not exist)" >&2
        STATUS[$name]="skipped: no script"
        continue
    fi
    echo "== $name: bash $script  (log: $RESULTS_DIR/$name.log)" >&2
    start=$(date +%s)
    if (cd "$ROOT" && bash "$script") >"$RESULTS_DIR/$name.log" 2>&1; then
        STATUS[$name]="ok in $(( $(date +%s) - start )) s"
    else
        rc=$?
        STATUS[$name]="FAILED (exit $rc; see $RESULTS_DIR/$name.log)"
        failed=1
        tail -n 15 "$RESULTS_DIR/$name.log" >&2
    fi
    if [ ! -s "$RESULTS_DIR/$name.tsv" ]; then
        STATUS[$name]="${STATUS[$name]}; no $name.tsv written"
    fi
done

# ---------------------------------------------------------------- the one table
echo
echo "Benchmarks: ours vs anchor (ratio = ours / anchor), results in $RESULTS_DIR"
printf '%-10s %-52s %14s %14s %8s  %s\n' bench case ours anchor ratio unit
printf '%-10s %-52s %14s %14s %8s  %s\n' ---------- ---------------------------------------------------- -------------- -------------- -------- ----
for name in "${NAMES[@]}"; do
    tsv="$RESULTS_DIR/$name.tsv"
    [ -s "$tsv" ] || continue
    # Skip the header line (whatever its exact spelling) and blank lines.
    awk -F'\t' -v bench="$name" '
        NR == 1 && tolower($1) == "case" { next }
        NF == 0 { next }
        { printf "%-10s %-52s %14s %14s %8s  %s\n", bench, substr($1, 1, 52), $2, $3, $4, $5 }
    ' "$tsv"
done
echo
for name in "${NAMES[@]}"; do
    printf '%-10s %s\n' "$name" "${STATUS[$name]}"
done
exit $failed
