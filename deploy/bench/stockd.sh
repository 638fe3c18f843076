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
# A second benchmark, on a 3-master + 3-replica cluster, compares redis.replica_acks = 1 with
# 0 (what the replica acknowledgement costs) and writes stockd_replicas.tsv.
# BENCH_ONLY=replicas runs that one alone, BENCH_ONLY=grpc the first one alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RESULTS_DIR="$(realpath -m "${RESULTS_DIR:-results}")"
mkdir -p "$RESULTS_DIR"
cargo build --release -p stockd --bins
case "${BENCH_ONLY:-}" in
    replicas) filter=bench_reserve_with_and_without_replica_acks ;;
    grpc) filter=bench_reserve_over_grpc_versus ;;
    "") filter="" ;;
    *) echo "BENCH_ONLY must be replicas or grpc, got '$BENCH_ONLY'" >&2; exit 2 ;;
esac
exec cargo test --release -p seckill-tests --no-default-features --features stockd \
    --test stockd_bench -- --ignored --nocapture --test-threads=1 $filter
