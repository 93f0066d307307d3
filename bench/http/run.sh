#!/usr/bin/env bash
# Acquire + release over HTTP/1.1 keep-alive (`distlock serve`) against the same backend used
# directly, on memory:// and redis://, beside a hyper server that does nothing (the ceiling),
# with reqwest and with a hand-written client; and the extra memory of 1,000 long-polling
# waiters.
# Usage: bench/http/run.sh [redis URL, default redis://127.0.0.1:6379] [seconds, default 5]
# COMPARE=PATH (another build of distlock) adds it to the same run, for a before and after.
set -euo pipefail
cd "$(dirname "$0")/../.."
redis=${1:-redis://127.0.0.1:6379}
seconds=${2:-5}
export PROTOC=${PROTOC:-/bin/false}
cargo build --release -p distlock-cli --bin distlock --example http_bench
target=${CARGO_TARGET_DIR:-target}
compare=()
if [ -n "${COMPARE:-}" ]; then
    compare=(--compare "$COMPARE")
fi
for backend in memory:// "$redis"; do
    "$target/release/examples/http_bench" --distlock "$target/release/distlock" \
        --backend "$backend" --seconds "$seconds" --concurrency 16 --waiters 1000 \
        --ceiling "${compare[@]}"
    "$target/release/examples/http_bench" --distlock "$target/release/distlock" \
        --backend "$backend" --seconds "$seconds" --concurrency 16 --waiters 10 \
        --ceiling --client raw "${compare[@]}"
done
