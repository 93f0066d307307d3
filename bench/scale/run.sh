#!/usr/bin/env bash
# The scale figures of every backend (crates/distlock-bench/src/bin/scale.rs): idle handles,
# held locks and their acquire rate, renewal CPU of client and server, release rate. Each server
# backend gets a throwaway server of its own, started by the program through distlock's testkit.
#   bench/scale/run.sh                              # every backend, about 10 minutes
#   bench/scale/run.sh --backends memory,redis --hold 20s
# Writes bench/scale/results/<UTC time>.jsonl and .md (a table) and prints the table.
# Needs the servers the testkit starts (redis-server, postgresql, mariadb-server, zookeeper,
# etcd-server) for the backends asked for.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
backends=memory,sqlite,redis,postgres,mysql,zookeeper,etcd
hold=60s
while [ $# -gt 0 ]; do
  case $1 in
    --backends) backends=$2; shift 2 ;;
    --hold) hold=$2; shift 2 ;;
    *) echo "usage: $0 [--backends LIST] [--hold DUR]" >&2; exit 2 ;;
  esac
done

# Idle handles cost the same on every backend (obtain() sends nothing), so only memory:// counts
# a million of them. ZooKeeper and etcd hold each lock on a server session or lease key of its
# own, so they hold 10 000 rather than 100 000.
args_for() {
  case $1 in
    memory) echo "--backend memory:// --idle 1000000 --held 100000" ;;
    zookeeper | etcd) echo "--spawn $1 --idle 0 --held 10000" ;;
    # One file takes one writer at a time: more tasks only queue, up to replies later than the
    # lease (which then count as not acquired).
    sqlite) echo "--spawn sqlite --idle 0 --held 100000 --concurrency 16" ;;
    *) echo "--spawn $1 --idle 0 --held 100000" ;;
  esac
}
features=scale
case ",$backends," in *,redis,*) features+=,redis ;; esac
case ",$backends," in *,postgres,* | *,mysql,*) features+=,sql ;; esac
case ",$backends," in *,zookeeper,*) features+=,zookeeper ;; esac
case ",$backends," in *,etcd,*) features+=,etcd ;; esac
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
  --features "$features" --bin scale
bin=$CARGO_TARGET_DIR/release/scale

out=$root/bench/scale/results
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
jsonl=$out/$stamp.jsonl
: >"$jsonl"
for b in ${backends//,/ }; do
  echo "== $b" >&2
  # shellcheck disable=SC2046
  if ! "$bin" $(args_for "$b") --hold "$hold" --json >>"$jsonl"; then
    echo "{\"backend\":\"$b\",\"error\":\"failed, see above\"}" >>"$jsonl"
  fi
done

python3 "$root/bench/scale/table.py" "$jsonl" "${jsonl%.jsonl}.md"
echo "results: $jsonl and ${jsonl%.jsonl}.md" >&2
