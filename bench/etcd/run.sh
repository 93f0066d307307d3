#!/usr/bin/env bash
# distlock's etcd backend beside the established etcd lock recipes of
# the other-backends harness ($DISTLOCK_OTHER_BACKENDS_HARNESS), by that harness's method (its server, workers and statistics,
# imported unchanged), in one run against one throwaway etcd.
#   bench/etcd/run.sh                 # about 2 minutes
#   bench/etcd/run.sh --s2-s 4 --pin none
# Needs etcd-server (and python3); the harness's etcd recipes use only the standard library.
# Builds the release worker (crate distlock-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
harness=${DISTLOCK_OTHER_BACKENDS_HARNESS:?set it to a checkout of the other-backends lock benchmark harness}
export DISTLOCK_OTHER_BACKENDS_HARNESS=$harness
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
  --features etcd --bin etcd_bench_worker
exec python3 "$root/bench/etcd/driver.py" "$@"
