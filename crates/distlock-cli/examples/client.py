#!/usr/bin/env python3
"""Hold a distlock lock over HTTP with the standard library only.

    python3 client.py http://127.0.0.1:7070 voucher:42 [TOKEN]

Takes the lock (waiting up to 10 s), keeps the lease by extending it while the work runs,
and releases it. A 410 on extend means the lease ended: stop, someone else may hold it.
"""
import json, sys, time, urllib.error, urllib.parse, urllib.request

base, key = sys.argv[1], urllib.parse.quote(sys.argv[2], safe="")
headers = {"Content-Type": "application/json"}  # the service refuses other bodies (415)
if len(sys.argv) > 3:
    headers["Authorization"] = "Bearer " + sys.argv[3]

def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")

status, hold = call("POST", f"/v1/locks/{key}", {"lease_ms": 10000, "wait_ms": 10000})
if status != 200:
    sys.exit(f"not acquired ({status}): {hold['error']}")
print(f"holding {hold['key']} with fence {hold['fence']}")
path = f"/v1/locks/{key}/{hold['token']}"
for step in range(3):  # the work: pass the fence with every write it protects
    time.sleep(1)
    status, lease = call("PUT", path, {"lease_ms": 10000})
    if status != 200:
        sys.exit(f"lost the lock ({status}): stop writing")
    print(f"step {step} done, lease left {lease['remaining_ms']} ms")
status, _ = call("DELETE", path)
print("released" if status == 204 else f"was already gone ({status})")
