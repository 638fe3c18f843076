#!/usr/bin/env bash
# Idle CPU against the number of live activities (issue 15, item 5): stockd, orderd and the
# gateway as release child processes on the harness' own Redis Cluster and MariaDB, with
# 10, 100 and 1,000 live activities (8 shards each) and no traffic; % of one core from
# /proc/<pid>/stat over IDLE_SECS per step. Two orderd run side by side on the same streams
# (their own consumer groups): the default one, woken by XADD key-events, and one polling
# every block_ms (consumer.keyspace_events = false: how every orderd worked before), the
# anchor of the same run. Then the time from a reservation to its order row in MySQL after
# idle, for each orderd (the other one stopped meanwhile).
# Writes ${RESULTS_DIR:-results}/idle.tsv (case, ours, anchor, ratio, unit) and prints a table.
#
#   deploy/bench/idle.sh                                   # 10,100,1000 activities, 30 s each
#   IDLE_COUNTS=10,100 IDLE_SECS=10 deploy/bench/idle.sh   # quicker
#   IDLE_COUNTS=2,4 IDLE_SECS=2 IDLE_PROFILE=debug deploy/bench/idle.sh   # smoke
set -euo pipefail
cd "$(dirname "$0")/../.."
export RESULTS_DIR="${RESULTS_DIR:-$PWD/results}"
export RUST_LOG="${RUST_LOG:-error}"
export IDLE_COUNTS="${IDLE_COUNTS:-10,100,1000}" IDLE_SECS="${IDLE_SECS:-30}"
PROFILE=()
if [ "${IDLE_PROFILE:-release}" = release ]; then PROFILE=(--release); fi
# The daemons run as child processes: their binaries first, in the same profile.
cargo build "${PROFILE[@]}" -p stockd -p orderd -p gateway --bins
cargo test "${PROFILE[@]}" -p seckill-tests --test idle_bench -- --ignored --nocapture --test-threads=1
