#!/usr/bin/env bash
# Measures distlock beside the bundled Redis lock peers in one run of the shared harness.
#   scripts/bench-peers.sh              # all scenarios, all peers (about 5 minutes)
#   scripts/bench-peers.sh S1 --peers raw,distlock
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${DISTLOCK_PEERS_HARNESS:-$root/../shared/bench/peers}
exec "$harness/run.sh" --peers-file "$harness/peers.json" --peers-file "$root/bench/peers.json" "$@"
