#!/usr/bin/env bash
# Many waiters on one key (crates/distlock-bench/src/bin/waiters_bench.rs): for each backend and
# each W, W waiters queue for one key and the bench prints one JSON line with the hand-over
# latency, the server's and the clients' CPU and the wake-ups per hand-over.
#   bench/waiters/run.sh                                   # every backend, every W of the README
#   bench/waiters/run.sh --backends redis,memory --waiters 10,100
# Every waiter is a registry of its own, spread over 10 worker processes; memory (which cannot
# cross processes) and every `<backend>-shared` name run W tasks on one registry in one process.
# Each run stops by itself after --handoffs hand-overs or --time seconds, whichever comes first.
# Every server is a throwaway one: ZooKeeper started here (see start_zookeeper), the others
# through distlock's testkit (PostgreSQL with
# max_connections=200, MariaDB with max_connections=300), so that its CPU is the bench's alone;
# the server is found by its listening port and its CPU read from /proc (its process tree).
# Builds waiters_bench in release, or in the dev profile with WAITERS_PROFILE=debug (what the
# README's figures used: no release build of the workspace fitted the machine that round).
# Writes bench/waiters/results/<UTC time>.jsonl too; bench/waiters/table.py makes the table.
# The peers of issue 29 (redis-py, python-redis-lock, redlock, redis-semaphore, kazoo), measured
# the same way: bench/waiters/peers/run.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
backends=memory,redis,zookeeper,etcd,postgres,mysql
waiters=
handoffs=2000
time_limit=20
max_poll=()
query=
while [ $# -gt 0 ]; do
  case $1 in
    --backends) backends=$2; shift 2 ;;
    --waiters) waiters=$2; shift 2 ;;
    --handoffs) handoffs=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    # A diagnostic: the registries' max_poll_interval in seconds (the library's default otherwise).
    --max-poll) max_poll=(--max-poll "$2"); shift 2 ;;
    --query) query=$2; shift 2 ;;
    *) echo "usage: $0 [--backends LIST] [--waiters LIST] [--handoffs N] [--time SECS] [--max-poll SECS] [--query PARAMS]" >&2; exit 2 ;;
  esac
done

# The W of issue 29 for each backend, when --waiters is not given.
default_waiters() {
  case $1 in
    memory | redis | redis-shared) echo 10,100,1000,10000 ;;
    zookeeper | etcd | zookeeper-shared | etcd-shared) echo 10,100,1000 ;;
    # The servers' default max_connections (PostgreSQL 100, MariaDB 151) bound the fleet.
    postgres | mysql | postgres-shared | mysql-shared) echo 10,100 ;;
    *) echo 10,100 ;;
  esac
}

# ZooKeeper refuses more than 60 connections from one address (maxClientCnxns), which the
# testkit's server keeps; the bench starts its own throwaway server without that bound (1 000
# registries are 1 000 sessions from 127.0.0.1), configured otherwise as the testkit's.
zk_pid=
zk_dir=
stop_zookeeper() {
  if [ -n "$zk_pid" ]; then kill "$zk_pid" 2>/dev/null || true; wait "$zk_pid" 2>/dev/null || true; fi
  if [ -n "$zk_dir" ]; then rm -rf "$zk_dir"; fi
  zk_pid= zk_dir=
}
trap stop_zookeeper EXIT
start_zookeeper() {
  zk_dir=$(mktemp -d /tmp/waiters-zk.XXXXXX)
  zk_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$zk_dir/zoo.cfg" <<CFG
tickTime=2000
dataDir=$zk_dir/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
maxClientCnxns=0
forceSync=no
admin.enableServer=false
4lw.commands.whitelist=ruok
CFG
  local cp=/usr/share/java/zookeeper.jar
  [ -f /usr/share/java/slf4j-simple.jar ] && cp+=:/usr/share/java/slf4j-simple.jar
  java -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.net.preferIPv4Stack=true \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dzookeeper.log.dir="$zk_dir" -cp "$cp" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$zk_dir/zoo.cfg" >"$zk_dir/log" 2>&1 &
  zk_pid=$!
  for _ in $(seq 600); do
    if [ "$(python3 -c "import socket; s=socket.create_connection(('127.0.0.1', $zk_port), 1); s.sendall(b'ruok'); print(s.recv(4).decode())" 2>/dev/null)" = imok ]; then
      return 0
    fi
    sleep 0.1
  done
  echo "ZooKeeper did not start: $(tail -5 "$zk_dir/log")" >&2
  return 1
}

features=waiters
case ",$backends," in *,redis*) features+=,redis ;; esac
case ",$backends," in *,postgres* | *,mysql*) features+=,sql ;; esac
case ",$backends," in *,zookeeper*) features+=,zookeeper ;; esac
case ",$backends," in *,etcd*) features+=,etcd ;; esac
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
profile=${WAITERS_PROFILE:-release}
if [ "$profile" = release ]; then
  cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
    --features "$features" --bin waiters_bench
  bin=$CARGO_TARGET_DIR/release/waiters_bench
else
  cargo build --quiet --manifest-path "$root/Cargo.toml" -p distlock-bench \
    --features "$features" --bin waiters_bench
  bin=$CARGO_TARGET_DIR/debug/waiters_bench
fi

out=$root/bench/waiters/results
mkdir -p "$out"
jsonl=$out/$(date -u +%Y%m%dT%H%M%SZ).jsonl
for b in ${backends//,/ }; do
  kind=${b%-shared}
  layout=()
  if [ "$kind" != "$b" ] || [ "$kind" = memory ]; then layout=(--shared); fi
  case $kind in
    memory) target=(--backend memory://) ;;
    # Every release hands over to the head of the queue (the default 5 ms slice lets a backend
    # that takes the key in a loop take it back, which is not a hand-over).
    redis) target=(--spawn redis --query "hold_slice=0ms${query:+&$query}") ;;
    etcd | postgres | mysql) target=(--spawn "$kind" ${query:+--query "$query"}) ;;
    zookeeper) target=(zookeeper) ;;
    *) echo "{\"backend\":\"$b\",\"error\":\"not measured by this bench yet\"}" | tee -a "$jsonl"; continue ;;
  esac
  list=${waiters:-$(default_waiters "$b")}
  for w in ${list//,/ }; do
    if [ "$kind" = zookeeper ]; then
      # A fresh server for each run, as the others get.
      stop_zookeeper
      start_zookeeper
      target=(--backend "zk://127.0.0.1:$zk_port" --server-pid "$zk_pid")
    fi
    # A hard bound on top of the program's own: start-up of 10 000 registries included.
    if ! timeout $((time_limit + 300)) "$bin" "${target[@]}" "${layout[@]}" "${max_poll[@]}" \
      --name "$b" --waiters "$w" --handoffs "$handoffs" --time "$time_limit" | tee -a "$jsonl"; then
      echo "{\"backend\":\"$b\",\"waiters\":$w,\"error\":\"failed, see above\"}" | tee -a "$jsonl"
    fi
  done
done
echo "results: $jsonl" >&2
