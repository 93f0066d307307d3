#!/usr/bin/env bash
# Measures distlock beside the bundled Redis lock peers in one run of the Redis lock benchmark harness,
# whose checkout $DISTLOCK_PEERS_HARNESS names (it is not part of this repository).
#   scripts/bench-peers.sh              # all scenarios, all peers (about 5 minutes)
#   scripts/bench-peers.sh S1 --peers raw,distlock
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${DISTLOCK_PEERS_HARNESS:?set it to a checkout of the Redis lock benchmark harness}
exec "$harness/run.sh" --peers-file "$harness/peers.json" --peers-file "$root/bench/peers.json" "$@"
