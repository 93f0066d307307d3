#!/usr/bin/env bash
# The lock kinds of every backend side by side (crates/distlock-bench/src/bin/kinds_bench.rs):
# uncontended mutex, read, write and permit cycles in alternating rounds; 16 tasks of one
# registry on a mutex and as readers; a 4-permit semaphore across 8 processes (holders inside
# at once counted, shares min/max). Each server backend gets a throwaway server of its own.
#   bench/kinds/run.sh                            # every backend, about 5 minutes
#   bench/kinds/run.sh --backends redis,sqlite --seconds 1
# Writes bench/kinds/results/<UTC time>.jsonl and prints one block per backend.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
backends=memory,sqlite,redis,postgres,mysql,zookeeper,etcd
seconds=2
while [ $# -gt 0 ]; do
  case $1 in
    --backends) backends=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "usage: $0 [--backends LIST] [--seconds S]" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
  --features scale,redis,sql,zookeeper,etcd --bin kinds_bench
bin=$CARGO_TARGET_DIR/release/kinds_bench
out=$root/bench/kinds/results
mkdir -p "$out"
jsonl=$out/$(date -u +%Y%m%dT%H%M%SZ).jsonl
for b in ${backends//,/ }; do
  if [ "$b" = memory ]; then src=(--backend memory://); else src=(--spawn "$b"); fi
  echo "== $b"
  "$bin" "${src[@]}" --seconds "$seconds" --json | tee -a "$jsonl"
done
echo "results: $jsonl"
