#!/usr/bin/env bash
# Stops exactly what up.sh started (by the pid files in deploy/local/state/pids): the daemons
# (every instance of a fleet: gateways, then orderd, then stockd), the Redis Cluster nodes
# (masters and replicas), and MariaDB only if up.sh started it. Data stays in
# deploy/local/state and in MariaDB's database `seckill`; `down.sh --purge` removes both (the
# database too, so the next up.sh applies the migrations to an empty one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for d in gateway orderd stockd; do
    for k in $(fleet_running "$d"); do stop_pid "$(fleet_name "$d" "$k")"; done
done
for p in "${REDIS_PORTS[@]}"; do stop_pid "redis-$p"; done
if [ "${1:-}" = --purge ] && command -v mariadb >/dev/null 2>&1 &&
    mariadb -h127.0.0.1 -P3306 -uroot -e 'DROP DATABASE IF EXISTS seckill' 2>/dev/null; then
    log "database seckill dropped"
fi
stop_pid mariadb
if [ "${1:-}" = --purge ]; then
    rm -rf "$STATE"
    log "state removed"
fi
log "local stack stopped"
