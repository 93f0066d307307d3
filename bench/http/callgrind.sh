#!/usr/bin/env bash
# User-space instructions of `distlock serve` per acquire + release cycle, under valgrind's
# callgrind: 200 cycles to warm up, counters zeroed, then 2,000 cycles from one keep-alive
# Python http.client connection. Independent of the machine's load, so two builds compare.
# Usage: bench/http/callgrind.sh DISTLOCK_BINARY [BACKEND_URL, default memory://]
set -euo pipefail
bin=$1
backend=${2:-memory://}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/drive.py" <<'PY'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
for i in range(n):
    key = "/v1/locks/k%d" % (i % 16)
    c.request("POST", key, body=b"")
    r = c.getresponse(); body = r.read()
    assert r.status == 200, (r.status, body)
    c.request("DELETE", key + "/" + json.loads(body)["token"])
    r = c.getresponse(); r.read()
    assert r.status == 204, r.status
PY
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "$bin" --backend "$backend" \
    --prefix "cg$$" serve --listen 127.0.0.1:0 > "$dir/stdout" 2> "$dir/stderr" &
pid=$!
for _ in $(seq 1 120); do
    grep -q listening "$dir/stdout" 2> /dev/null && break
    sleep 0.5
done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/stdout")
python3 "$dir/drive.py" "$port" 200
callgrind_control -z "$pid" > /dev/null 2>&1
python3 "$dir/drive.py" "$port" 2000
callgrind_control -d "$pid" > /dev/null 2>&1
sleep 1
kill -TERM "$pid"
wait "$pid" || true
total=$(callgrind_annotate "$dir"/cg.out.1 | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$bin $backend: $((total / 2000)) instructions per cycle"
