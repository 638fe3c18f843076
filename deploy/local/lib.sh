# shellcheck shell=bash
# Shared helpers for the local stack scripts (sourced, not run).
#
# ROOT   the repository root          STATE  deploy/local/state (pid files, logs, data)

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE=${SECKILL_STATE:-$ROOT/deploy/local/state}
mkdir -p "$STATE/logs" "$STATE/pids"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi
_apt_updated=0

# ensure_pkg COMMAND PACKAGE...: installs the Debian packages when COMMAND is missing.
ensure_pkg() {
    local cmd=$1; shift
    command -v "$cmd" >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || die "$cmd is missing and apt-get is not available: install $*"
    if [ "$_apt_updated" = 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
        _apt_updated=1
    fi
    log "installing $* (for $cmd)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -qq "$@" >/dev/null || die "apt-get install $* failed"
}

# ensure_rust: cargo with rustfmt and clippy, and the C tools crates build with: gcc, g++ and
# cmake (pingora compresses with zlib-ng, which libz-ng-sys builds with cmake).
ensure_rust() {
    ensure_pkg cc gcc
    ensure_pkg c++ g++
    ensure_pkg cmake cmake
    if ! command -v cargo >/dev/null 2>&1; then
        [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null 2>&1 || die "cargo is missing: install Rust with rustup (https://rustup.rs)"
    if command -v rustup >/dev/null 2>&1; then
        cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt >/dev/null 2>&1 || true
        cargo clippy --version >/dev/null 2>&1 || rustup component add clippy >/dev/null 2>&1 || true
    fi
}

# tcp_open PORT: something listens on 127.0.0.1:PORT.
tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for WHAT SECONDS COMMAND...: polls COMMAND every 0.1 s.
wait_for() {
    local what=$1 secs=$2; shift 2
    local tries=$((secs * 10))
    for _ in $(seq "$tries"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

# pid_alive NAME: the process recorded in $STATE/pids/NAME.pid runs.
pid_alive() {
    local f="$STATE/pids/$1.pid"
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

# stop_pid NAME: SIGTERM, wait up to 10 s, then SIGKILL; removes the pid file.
stop_pid() {
    local f="$STATE/pids/$1.pid" pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "$1 ($pid) did not stop on SIGTERM; killing"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$f" "$STATE/pids/$1.conf"
}

# start_bg NAME COMMAND...: starts COMMAND detached, logging to $STATE/logs/NAME.log.
start_bg() {
    local name=$1; shift
    setsid "$@" >>"$STATE/logs/$name.log" 2>&1 < /dev/null &
    echo $! >"$STATE/pids/$name.pid"
}

# Binaries: release by default; SECKILL_PROFILE=debug reuses a debug build (CI).
PROFILE=${SECKILL_PROFILE:-release}
BIN="$ROOT/target/$PROFILE"

build_bins() {
    ensure_rust
    ensure_pkg cc gcc
    local flag=--release
    [ "$PROFILE" = debug ] && flag=
    log "building $PROFILE binaries (the first build takes several minutes)"
    (cd "$ROOT" && cargo build $flag --bins -p stockd -p orderd -p gateway -p seckill-tests) || die "cargo build failed"
}

# The local Redis Cluster: three masters (7001-7003, slots split in thirds) and, by default,
# one replica each: 7004 follows 7001, 7005 follows 7002, 7006 follows 7003 (a failover swaps
# the roles; the ports stay). SECKILL_REDIS_REPLICAS=0 (or up.sh --replicas 0) runs the masters
# only. SECKILL_REDIS_NODE_TIMEOUT_MS is cluster-node-timeout (ms, default 5000): how long a
# master may not answer before its replica takes over (about that plus 1-2 s).
REDIS_MASTER_PORTS=(7001 7002 7003)
REDIS_REPLICA_PORTS=(7004 7005 7006)
REDIS_PORTS=("${REDIS_MASTER_PORTS[@]}" "${REDIS_REPLICA_PORTS[@]}")
REDIS_REPLICAS=${SECKILL_REDIS_REPLICAS:-1}
REDIS_NODE_TIMEOUT_MS=${SECKILL_REDIS_NODE_TIMEOUT_MS:-5000}
# The daemons' ports as the shipped configs in deploy/local/ set them: gRPC and metrics.
DAEMON_PORTS=(50051 9092 50052 9093 8080 9091)

# The fleet (up.sh --fleet N): instance 1 of each daemon is the one above, on the shipped
# config's ports; instance K >= 2 gets consecutive ports of its own range:
#   stockd  gRPC 50100+K (50102, 50103, ...)  admin 9200+K
#   orderd  gRPC 50200+K (50202, 50203, ...)  admin 9300+K
#   gateway HTTP 8079+K  (8081, 8082, ...)    admin 9100+K
FLEET_MAX=20
# fleet_port DAEMON K: the gRPC (HTTP for the gateway) port of instance K.
fleet_port() {
    case "$1:$2" in
        stockd:1) echo 50051 ;; orderd:1) echo 50052 ;;
        stockd:*) echo $((50100 + $2)) ;; orderd:*) echo $((50200 + $2)) ;;
        gateway:*) echo $((8079 + $2)) ;;
    esac
}
# fleet_admin_port DAEMON K: the admin (metrics, health) port of instance K.
fleet_admin_port() {
    case "$1:$2" in
        gateway:1) echo 9091 ;; stockd:1) echo 9092 ;; orderd:1) echo 9093 ;;
        gateway:*) echo $((9100 + $2)) ;; stockd:*) echo $((9200 + $2)) ;; orderd:*) echo $((9300 + $2)) ;;
    esac
}
# fleet_name DAEMON K: the name of instance K in state/pids and state/logs (stockd, stockd-2, ...).
fleet_name() { if [ "$2" = 1 ]; then echo "$1"; else echo "$1-$2"; fi; }
# fleet_running DAEMON: the instance numbers with a pid file, one a line.
fleet_running() {
    local f n
    for f in "$STATE/pids/$1.pid" "$STATE/pids/$1"-*.pid; do
        [ -f "$f" ] || continue
        n=$(basename "$f" .pid); n=${n#"$1"}; n=${n#-}
        echo "${n:-1}"
    done
}

# port_holder PORT: "name(pid)" of the process listening on 127.0.0.1:PORT, empty when none.
port_holder() {
    command -v ss >/dev/null 2>&1 || return 0
    # A free port makes grep fail; under `set -o pipefail` that must not fail the caller.
    { ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:(("[^"]*",pid=[0-9]*' | head -n1 \
        | sed 's/users:(("\([^"]*\)",pid=\([0-9]*\)/\1(\2)/'; } || true
}

# port_sockets PORT: the sockets other than listeners whose local end is 127.0.0.1:PORT (or any
# address), one "STATE peer process" per line: what keeps a listener from binding PORT (see
# port_bindable). Empty when none (or without ss).
port_sockets() {
    command -v ss >/dev/null 2>&1 || return 0
    { ss -Htanp "sport = :$1" 2>/dev/null | awk '$1 != "LISTEN" { print $1, $5, $6 }'; } || true
}

# port_bindable PORT: true when a listener could bind 127.0.0.1:PORT now, with SO_REUSEADDR as
# the daemons bind (tokio's TcpListener). A client connection that was handed PORT as its
# ephemeral port before reserve_ports ran blocks that bind while it is open, and then for the
# 60 s of its TIME-WAIT: Linux lets SO_REUSEADDR pass only the TIME-WAITs of sockets that had
# it (a listener's accepted connections), not a client's. So this tries the bind itself (perl
# is Essential on Debian); without perl it falls back to "no socket but TIME-WAIT on PORT".
port_bindable() {
    if command -v perl >/dev/null 2>&1; then
        perl -MIO::Socket::INET -e 'exit(IO::Socket::INET->new(LocalAddr => "127.0.0.1",
            LocalPort => $ARGV[0], Proto => "tcp", Listen => 1, ReuseAddr => 1) ? 0 : 1)' "$1"
        return
    fi
    [ -z "$(port_sockets "$1" | awk '$1 != "TIME-WAIT"')" ]
}

# port_held_by PORT: the first sockets of port_sockets on one line, for a message.
port_held_by() { port_sockets "$1" | head -n 5 | paste -sd ';' -; }

# wait_port_free PORT SECONDS: waits until a listener could bind PORT (port_bindable); fails
# naming the sockets that hold it when SECONDS pass first.
wait_port_free() {
    local p=$1 left=$2
    while ! port_bindable "$p"; do
        if [ "$left" -le 0 ]; then
            echo "127.0.0.1:$p is still held by: $(port_held_by "$p")" >&2
            return 1
        fi
        [ "$left" = "$2" ] && log "waiting for 127.0.0.1:$p to be free (held by: $(port_held_by "$p"))"
        sleep 1; left=$((left - 1))
    done
}

# reserve_ports PORT...: keeps the kernel from handing these ports out as the local end of
# outgoing connections (net.ipv4.ip_local_reserved_ports), so a stray client socket cannot hold
# a port a daemon is about to listen on: 50051-50052 lie inside Linux's ephemeral range. Needs
# root; without it (or in a container with a read-only /proc/sys) this is skipped.
reserve_ports() {
    local f=/proc/sys/net/ipv4/ip_local_reserved_ports cur want p
    [ -r "$f" ] || return 0
    cur=$(cat "$f")
    want=$cur
    for p in "$@"; do
        case ",$cur," in *",$p,"*) ;; *) want="${want:+$want,}$p" ;; esac
    done
    [ "$want" = "$cur" ] && return 0
    if [ "$(id -u)" = 0 ]; then
        echo "$want" >"$f" 2>/dev/null || true
    elif [ -n "$SUDO" ]; then
        echo "$want" | $SUDO tee "$f" >/dev/null 2>&1 || true
    fi
}
MYSQL_URL=${SECKILL_MYSQL_URL:-mysql://root@127.0.0.1:3306/seckill}
