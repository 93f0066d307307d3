#!/usr/bin/env bash
# Leader elections on every backend (crates/distlock-bench/src/bin/election_bench.rs): the
# time from a leader's death (SIGKILL) to the next leader's start, from a resignation to the
# next leader's start, and the CPU an idle candidate costs. Each server backend gets a
# throwaway server of its own.
#   bench/election/run.sh                           # every backend, a few minutes
#   bench/election/run.sh --backends redis,sqlite --rounds 5 --lease-ms 2000
# Writes bench/election/results/<UTC time>.jsonl and prints one line per backend.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
backends=sqlite,redis,postgres,mysql,zookeeper,etcd
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --backends) backends=$2; shift 2 ;;
    --rounds|--lease-ms|--candidates|--seconds) extra+=("$1" "$2"); shift 2 ;;
    *) echo "usage: $0 [--backends LIST] [--rounds N] [--lease-ms MS] [--candidates N] [--seconds S]" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
  --features scale,redis,sql,zookeeper,etcd --bin election_bench
bin=$CARGO_TARGET_DIR/release/election_bench
out=$root/bench/election/results
mkdir -p "$out"
jsonl=$out/$(date -u +%Y%m%dT%H%M%SZ).jsonl
for b in ${backends//,/ }; do
  echo "== $b"
  more=()
  # Each ZooKeeper candidate has a session (a connection) of its own for its lease beside its
  # registry's, and ZooKeeper takes at most 60 connections from one address by default.
  if [ "$b" = zookeeper ]; then more=(--candidates 20); fi
  "$bin" --spawn "$b" "${more[@]}" "${extra[@]}" --json | tee -a "$jsonl"
done
echo "results: $jsonl"
