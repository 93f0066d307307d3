#!/usr/bin/env bash
# distlock's ZooKeeper backend beside kazoo's Lock, by the method of
# the other-backends harness in $DISTLOCK_OTHER_BACKENDS_HARNESS (its server settings, worker protocol and statistics, imported
# unchanged), against one throwaway ZooKeeper server, in one run.
#   bench/zookeeper/run.sh                 # about 1 minute
#   bench/zookeeper/run.sh --s2-s 4 --pin none
# Needs the packages of that harness (zookeeper, python3-venv); makes target/bench-venv
# (kazoo from the harness's requirements.txt) and builds the release worker (crate distlock-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
harness=${DISTLOCK_OTHER_BACKENDS_HARNESS:?set it to a checkout of the other-backends lock benchmark harness}
export DISTLOCK_OTHER_BACKENDS_HARNESS=$harness
venv=$root/target/bench-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! cmp -s "$harness/requirements.txt" "$venv/.installed-requirements" 2>/dev/null; then
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$harness/requirements.txt"
  cp "$harness/requirements.txt" "$venv/.installed-requirements"
fi
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
  --features zookeeper --bin zk_bench_worker
exec "$venv/bin/python" "$root/bench/zookeeper/driver.py" "$@"
