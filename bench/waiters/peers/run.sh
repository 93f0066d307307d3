#!/usr/bin/env bash
# The peers of issue 29 on bench/waiters's measure (driver.py): W waiters on one key, each a
# client of its own, spread over 10 processes, one JSON line per peer and W.
#   bench/waiters/peers/run.sh                                   # every peer, the W of the README
#   bench/waiters/peers/run.sh --peers kazoo --waiters 10,100 --handoffs 1000 --time 15
# Installs the peers on first use: requirements.txt into bench/waiters/peers/.venv,
# node/package-lock.json into node/node_modules (npm ci), and for the Go peer Debian's Go and
# etcd sources (apt-get; go.etcd.io/etcd/clientv3 from /usr/share/gocode, no module proxy), with
# go/worker.go built into go/bin. Appends to
# bench/waiters/results/<UTC time>-peers.jsonl; bench/waiters/table.py makes the table.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peers=redis-py,python-redis-lock,node-redlock,redis-semaphore,kazoo,go-concurrency-mutex
waiters=
handoffs=2000
time_limit=20
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --peers) peers=$2; shift 2 ;;
    --waiters) waiters=$2; shift 2 ;;
    --handoffs) handoffs=$2; shift 2 ;;
    --time) time_limit=$2; shift 2 ;;
    # at-once: a released waiter queues again at once (and these libraries let it take the
    # key straight back); after-handover (the default): once another waiter holds the key.
    --requeue) extra=(--requeue "$2"); shift 2 ;;
    *) echo "usage: $0 [--peers LIST] [--waiters LIST] [--handoffs N] [--time SECS] [--requeue after-handover|at-once]" >&2; exit 2 ;;
  esac
done

venv=$here/.venv
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
if ! cmp -s "$here/requirements.txt" "$venv/.installed-requirements.txt"; then
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$venv/.installed-requirements.txt"
fi

case ",$peers," in
  *,node-redlock,* | *,redis-semaphore,*)
    if ! cmp -s "$here/node/package-lock.json" "$here/node/node_modules/.installed-package-lock.json"; then
      (cd "$here/node" && npm ci --no-audit --no-fund --loglevel=error)
      cp "$here/node/package-lock.json" "$here/node/node_modules/.installed-package-lock.json"
    fi ;;
esac

case ",$peers," in
  *,go-concurrency-mutex,*)
    # The Go client as Debian ships it (etcd 3.4.23's clientv3, as the etcd-server it talks to),
    # built in GOPATH mode against /usr/share/gocode: no module download.
    gocode=/usr/share/gocode
    if ! command -v go >/dev/null || [ ! -d "$gocode/src/go.etcd.io/etcd/clientv3/concurrency" ]; then
      apt-get install -y -q --no-install-recommends golang-go golang-etcd-server-dev >&2
    fi
    stamp=$here/go/bin/.built-from
    if [ ! -x "$here/go/bin/worker" ] \
      || ! printf '%s\n' "$(sha256sum "$here/go/worker.go")" "$(go version)" | cmp -s - "$stamp"; then
      mkdir -p "$here/go/bin"
      (cd "$here/go" && GO111MODULE=off GOPATH=$gocode GOFLAGS= GOPROXY=off go build -o bin/worker .)
      printf '%s\n' "$(sha256sum "$here/go/worker.go")" "$(go version)" > "$stamp"
    fi ;;
esac

out=$here/../results
mkdir -p "$out"
jsonl=$out/$(date -u +%Y%m%dT%H%M%SZ)-peers.jsonl
for p in ${peers//,/ }; do
  case $p in
    redis-py | python-redis-lock | node-redlock | redis-semaphore) backend=redis ;;
    kazoo) backend=zookeeper ;;
    go-concurrency-mutex) backend=etcd ;;
    *) echo "{\"backend\":\"-\",\"client\":\"$p\",\"error\":\"not a peer of this bench\"}" | tee -a "$jsonl"; continue ;;
  esac
  list=${waiters:-10,100,1000}
  for w in ${list//,/ }; do
    # A hard bound on top of the driver's own: connecting 1 000 sessions included.
    if ! timeout $((${time_limit%.*} + 300)) "$venv/bin/python" "$here/driver.py" --peer "$p" \
      --waiters "$w" --handoffs "$handoffs" --time "$time_limit" "${extra[@]}" | tee -a "$jsonl"; then
      echo "{\"backend\":\"$backend\",\"client\":\"$p\",\"waiters\":$w,\"error\":\"failed, see above\"}" | tee -a "$jsonl"
    fi
  done
done
echo "results: $jsonl" >&2
