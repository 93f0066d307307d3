#!/usr/bin/env bash
# Acquire + release over HTTP/1.1 keep-alive (`distlock serve`) against the same backend used
# directly, on memory:// and redis://, beside a hyper server and an axum router that do nothing
# (the ceilings), with reqwest and with a hand-written client; the extra memory of 1,000
# long-polling waiters; then `distlock serve` on etcd:// against etcd's own HTTP gateway
# (`/v3/lock/lock`, `/v3/lock/unlock`) with 1, 4 and 16 concurrent clients.
# Usage: bench/http/run.sh [redis URL, default redis://127.0.0.1:6379] [seconds, default 5]
# COMPARE=PATH (another build of distlock) adds it to the same run, for a before and after.
# ONLY=etcd runs the etcd comparison alone; ONLY=overhead the memory and Redis runs alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
redis=${1:-redis://127.0.0.1:6379}
seconds=${2:-5}
only=${ONLY:-}
export PROTOC=${PROTOC:-/bin/false}
cargo build --release -p distlock-cli --bin distlock --example http_bench
target=${CARGO_TARGET_DIR:-target}
bench=$target/release/examples/http_bench
distlock=$target/release/distlock
compare=()
if [ -n "${COMPARE:-}" ]; then
    compare=(--compare "$COMPARE")
fi
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ "$only" != etcd ]; then
    for backend in memory:// "$redis"; do
        "$bench" --distlock "$distlock" --backend "$backend" --seconds "$seconds" \
            --concurrency 16 --waiters 1000 --ceiling --axum-ceiling "${compare[@]}"
        "$bench" --distlock "$distlock" --backend "$backend" --seconds "$seconds" \
            --concurrency 16 --waiters 10 --ceiling --axum-ceiling --client raw "${compare[@]}"
    done
fi
if [ "$only" != overhead ]; then
    # A throwaway etcd (Debian's etcd-server) on free loopback ports; its gateway is on its
    # client port.
    free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
    client=$(free_port)
    peer=$(free_port)
    dir=$(mktemp -d /tmp/distlock-http-bench-etcd.XXXXXX)
    etcd --name bench --data-dir "$dir/data" \
        --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "bench=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
    etcd_pid=$!
    trap 'kill $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$client/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
    for c in 1 4 16; do
        "$bench" --distlock "$distlock" --backend "etcd://127.0.0.1:$client" --seconds "$seconds" \
            --concurrency "$c" --waiters 0 --etcd-gateway "http://127.0.0.1:$client" \
            --etcd-pid "$etcd_pid"
    done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
