#!/usr/bin/env bash
# orderd benchmark: drain N queued reservations (default 50,000) from the Redis
# streams into MariaDB, batched versus one transaction per order, in one run
# (the one-per-transaction baseline drains N/5 by default: its rate is per order).
# Starts its own Redis Cluster and MariaDB (or uses SECKILL_TEST_MYSQL_URL).
# Writes ${RESULTS_DIR:-results}/orderd.tsv (case, ours, anchor, ratio, unit).
#
#   deploy/bench/orderd.sh                 # 50,000 orders, batches of 500
#   BENCH_ORDERS=10000 BENCH_BATCH=200 deploy/bench/orderd.sh
#   BENCH_BASELINE_ORDERS=50000 deploy/bench/orderd.sh   # baseline drains all 50,000 too (slow)
set -euo pipefail
cd "$(dirname "$0")/../.."
export RESULTS_DIR="${RESULTS_DIR:-$PWD/results}"
export RUST_LOG="${RUST_LOG:-error}"
cargo test --release -p seckill-tests --no-default-features --features orderd \
  --test orderd_bench -- --ignored --nocapture --test-threads=1
