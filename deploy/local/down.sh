#!/usr/bin/env bash
# Stops exactly what up.sh started (by the pid files in deploy/local/state/pids): the daemons,
# the Redis Cluster nodes, and MariaDB only if up.sh started it. Data stays in
# deploy/local/state; `down.sh --purge` removes it too.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for name in gateway orderd stockd; do stop_pid "$name"; done
for p in "${REDIS_PORTS[@]}"; do stop_pid "redis-$p"; done
stop_pid mariadb
if [ "${1:-}" = --purge ]; then
    rm -rf "$STATE"
    log "state removed"
fi
log "local stack stopped"
