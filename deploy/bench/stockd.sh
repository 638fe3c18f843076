#!/usr/bin/env bash
# stockd benchmark (issue 3): Reserve over gRPC at 64 concurrent callers versus the
# same reserve.lua called directly (EVALSHA), in one run, on a 3-master Redis Cluster
# and a MariaDB started by the test harness. Prints a table and writes
# ${RESULTS_DIR:-results}/stockd.tsv (case, ours, anchor, ratio, unit).
#
# Knobs: BENCH_SECS (per case, default 5), BENCH_ROUNDS (anchor-then-ours rounds, default 5;
# the report takes the median round), BENCH_CONCURRENCY (default 64),
# BENCH_CONNS (HTTP/2 connections per load-generator thread, default 1),
# BENCH_LOADGEN_THREADS (load-generator threads, each its own event loop, default 2),
# SECKILL_TEST_MYSQL_URL (reuse a MariaDB server instead of starting one), and for A/B
# runs BENCH_STOCKD_GRPC / BENCH_STOCKD_STOCK: TOML lines added to stockd's [grpc] /
# [stock] sections, e.g. BENCH_STOCKD_GRPC="worker_threads = 1" (default: none).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RESULTS_DIR="$(realpath -m "${RESULTS_DIR:-results}")"
mkdir -p "$RESULTS_DIR"
cargo build --release -p stockd --bins
exec cargo test --release -p seckill-tests --no-default-features --features stockd \
    --test stockd_bench -- --ignored --nocapture --test-threads=1
