#!/usr/bin/env bash
# distlock's PostgreSQL and MariaDB backends beside the established recipes of
# the other-backends harness ($DISTLOCK_OTHER_BACKENDS_HARNESS), by that harness's method (its servers, workers and statistics,
# imported unchanged), in one run.
#   bench/sql/run.sh                       # both databases (about 3 minutes)
#   bench/sql/run.sh --backends pg --s2-s 4
# Needs the packages of that harness (postgresql, mariadb-server, libmariadb-dev,
# pkg-config, python3-venv); makes target/bench-venv and builds the release worker (crate distlock-bench).
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
  --features sql --bin sql_bench_worker
exec "$venv/bin/python" "$root/bench/sql/driver.py" "$@"
