#!/usr/bin/env python3
"""Issue 29's many-waiters bench for distlock's peers: W waiters on one key, spread over OS
processes, each waiter a client of its own (a thread in Python, since these libraries block; an
async task in Node). Prints one JSON line with the fields of waiters_bench's, plus `client` (the
peer), `wait` (how it waits), `requeue` and `found_free`.

    driver.py --peer redis-py|python-redis-lock|node-redlock|redis-semaphore|kazoo|go-concurrency-mutex
              --waiters W [--procs 10] [--handoffs N] [--time SECS] [--requeue after-handover|at-once]

The coordinator starts a throwaway server (redis-server, ZooKeeper with maxClientCnxns=0, or a
single-node etcd), the worker processes (this file with --worker, node/worker.js for the Node
peers, go/bin/worker for the Go peer, which run.sh builds), opens the
window at one CLOCK_MONOTONIC instant once every waiter is connected and warmed up, and closes it
after --handoffs holds (the counter file every holder increments) or --time seconds.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from importlib.metadata import version as pkg_version

KEY = "waiters-bench"
TTL_S = 30


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def read_counter(path):
    try:
        with open(path) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def proc_cpu_s(pid):
    """user + system CPU of pid and of its children (their own, not their reaped ones)."""
    def fields(p):
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            return None
        return s[s.rfind(")") + 1:].split()

    def cpu(f):
        return (int(f[11]) + int(f[12])) / 100.0

    own = fields(pid)
    if own is None:
        return None
    total = cpu(own)
    for p in os.listdir("/proc"):
        if p.isdigit():
            f = fields(p)
            if f is not None and f[1] == str(pid):
                total += cpu(f)
    return total


# ---------------------------------------------------------------------------------------------
# The peers. Each makes (acquire, release) for one waiter with a client of its own, and counts
# into `stats`: "attempts" (tries to take the key after the first of each acquire()) and
# "wakeups" (a waiting thread woken by the library's wait: a poll's sleep ending, a BLPOP
# returning, a watch firing). Counting stops with the window (stats["open"]).

class Peer:
    backend = "redis"

    def __init__(self, name, url, stats):
        self.name, self.url, self.stats = name, url, stats

    def count(self, what):
        if self.stats["open"]:
            self.stats[what] += 1


class RedisPy(Peer):
    """redis.lock.Lock: SET NX PX; while busy, sleep `sleep` (0.1 s by default) and try again."""
    client = "redis-py Lock"
    wait = "poll: SET NX every sleep=0.1 s (library default)"

    def version(self):
        return "redis " + pkg_version("redis")

    def new(self):
        import redis
        r = redis.Redis.from_url(self.url)
        lock = r.lock(KEY, timeout=TTL_S, blocking=True)
        inner = lock.do_acquire
        first = threading.local()

        def do_acquire(token):
            # Each call after the first of an acquire() follows a sleep: a wake-up and an attempt.
            if first.done:
                self.count("attempts")
                self.count("wakeups")
            first.done = True
            return inner(token)

        lock.do_acquire = do_acquire

        def acquire():
            first.done = False
            return lock.acquire()
        return acquire, lock.release, lambda: r.ping()


class PythonRedisLock(Peer):
    """redis_lock.Lock: SET NX EX; while busy, BLPOP the key's signal list, which release pushes."""
    client = "python-redis-lock"
    wait = "BLPOP on the key's signal list, pushed by release (library default)"

    def version(self):
        return "python-redis-lock %s (redis %s)" % (pkg_version("python-redis-lock"),
                                                   pkg_version("redis"))

    def new(self):
        import redis
        import redis_lock
        peer = self

        class Counted(redis.Redis):
            # The lock calls its client's set once per try and blpop once per wait.
            def set(self, *a, **kw):
                if self.first_done:
                    peer.count("attempts")
                self.first_done = True
                return super().set(*a, **kw)

            def blpop(self, *a, **kw):
                r = super().blpop(*a, **kw)
                peer.count("wakeups")
                return r

        # Its BLPOP waits up to `expire` (30 s): redis-py 8's default socket_timeout (5 s) would
        # end longer waits with a TimeoutError, which earlier redis-py (no timeout) did not.
        r = Counted.from_url(self.url, socket_timeout=None)
        lock = redis_lock.Lock(r, KEY, expire=TTL_S)

        def acquire():
            r.first_done = False
            return lock.acquire(blocking=True)
        return acquire, lock.release, lambda: r.ping()


class Kazoo(Peer):
    """kazoo.recipe.lock.Lock: a sequential node; list the children, watch the predecessor."""
    backend = "zookeeper"
    client = "kazoo Lock"
    wait = "watch on the predecessor's node; each try lists the lock's children"

    def version(self):
        return "kazoo " + pkg_version("kazoo")

    def new(self):
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=self.url, timeout=30)
        zk.start(timeout=120)
        lock = zk.Lock("/" + KEY)
        peer = self
        get_predecessor, watch = lock._get_predecessor, lock._watch_predecessor
        state = {"first": True}

        def counted_get_predecessor(node):
            # One call per try, each a getChildren of the lock's node.
            if not state["first"]:
                peer.count("attempts")
            state["first"] = False
            return get_predecessor(node)

        def counted_watch(event):
            peer.count("wakeups")
            return watch(event)

        lock._get_predecessor = counted_get_predecessor
        lock._watch_predecessor = counted_watch

        def acquire():
            state["first"] = True
            return lock.acquire(blocking=True)
        return acquire, lock.release, lambda: zk.exists("/")


HERE = os.path.dirname(os.path.abspath(__file__))


def node_version(name):
    with open(os.path.join(HERE, "node", "node_modules", name, "package.json")) as f:
        return name + " " + json.load(f)["version"].lstrip("v")


class NodeRedlock(Peer):
    """redlock (v5) on one server: EVALSHA of its acquire script; retry after 200 ± 100 ms."""
    client = "node-redlock"
    wait = "retry the acquire script after 200 ± 100 ms (library default), retryCount -1"
    node = True

    def version(self):
        return node_version("redlock") + " (" + node_version("ioredis") + ")"


class RedisSemaphore(Peer):
    """redis-semaphore's Mutex: SET NX PX; retry every retryInterval (10 ms by default)."""
    client = "redis-semaphore Mutex"
    wait = "poll: SET NX every retryInterval=10 ms (library default)"
    node = True

    def version(self):
        return node_version("redis-semaphore") + " (" + node_version("ioredis") + ")"


GO_WORKER = os.path.join(HERE, "go", "bin", "worker")


class GoConcurrencyMutex(Peer):
    """etcd's Go concurrency.Mutex (go/worker.go): a key per session under the prefix, put in a
    txn; wait for the newest key created before it to be deleted (a Get, then a watch)."""
    backend = "etcd"
    client = "Go concurrency.Mutex"
    wait = "watch on the newest key created before its own (a Get sorted by create revision, " \
        "then a watch from that Get's revision)"
    cmd = [GO_WORKER]

    def version(self):
        v = subprocess.run([GO_WORKER, "--version"], capture_output=True, text=True, check=True)
        return v.stdout.strip()


PEERS = {"redis-py": RedisPy, "python-redis-lock": PythonRedisLock, "kazoo": Kazoo,
         "node-redlock": NodeRedlock, "redis-semaphore": RedisSemaphore,
         "go-concurrency-mutex": GoConcurrencyMutex}


# ---------------------------------------------------------------------------------------------
# A worker process: `waiters` threads, each a waiter with a client of its own.

def worker(a):
    import logging
    # kazoo logs every dropped connection, including its own at the worker's exit.
    logging.basicConfig(level=logging.ERROR)
    stats = {"open": False, "attempts": 0, "wakeups": 0}
    peer = PEERS[a.peer](a.peer, a.url, stats)
    made = [None] * a.waiters
    errors = []

    def make(i):
        try:
            acquire, release, ping = peer.new()
            ping()
            made[i] = (acquire, release)
        except Exception as e:  # noqa: BLE001 - reported as the worker's error
            errors.append("connect: %r" % (e,))

    # Connecting 100 ZooKeeper sessions one after the other takes long: in parallel, in batches.
    for b in range(0, a.waiters, 50):
        ts = [threading.Thread(target=make, args=(i,)) for i in range(b, min(b + 50, a.waiters))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    if errors:
        print(json.dumps({"ev": "failed", "error": errors[0]}), flush=True)
        os._exit(1)
    # A warm-up hold for each waiter (connections, scripts, the lock's parent node), serial.
    for acquire, release in made:
        acquire()
        release()
    print(json.dumps({"ev": "ready"}), flush=True)
    line = sys.stdin.readline().split()
    start = int(line[1])

    mu = threading.Lock()
    state = {"stopped": False, "in_cs": 0}
    holds = []
    errs = {"n": 0, "first": None}

    def error(what):
        with mu:
            errs["n"] += 1
            errs["first"] = errs["first"] or what

    def run(i):
        acquire, release = made[i]
        while mono_ns() < start:
            time.sleep(max(0, (start - mono_ns()) / 1e9))
        while True:
            t0 = mono_ns()
            try:
                ok = acquire()
            except Exception as e:  # noqa: BLE001
                error("acquire: %r" % (e,))
                time.sleep(0.01)
                continue
            if not ok:
                error("acquire returned False")
                continue
            t1 = mono_ns()
            with mu:
                if state["stopped"]:
                    release()
                    return
                state["in_cs"] += 1
            n = read_counter(a.counter) + 1
            with open(a.counter, "w") as f:
                f.write(str(n))
            if a.requeue == "after-handover" and n > 1:
                # Hold until the previous holder has queued again (its marker file), so that
                # it waits like the others instead of finding the key free after this release.
                marker, until = f"{a.counter}.q{n - 1}", time.monotonic() + 0.05
                while not os.path.exists(marker) and time.monotonic() < until:
                    time.sleep(0.0002)
            t2 = mono_ns()
            try:
                release()
            except Exception as e:  # noqa: BLE001
                error("release: %r" % (e,))
            holds.append((t0, t1, t2, i))
            with mu:
                state["in_cs"] -= 1
            if a.requeue == "after-handover":
                # Queue again once another waiter holds the key (the counter moved on): these
                # libraries let a releaser take the key straight back, which is no hand-over.
                while read_counter(a.counter) == n and not state["stopped"]:
                    time.sleep(0.0005)
                open(f"{a.counter}.q{n}", "w").close()

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(a.waiters)]
    while mono_ns() < start:
        time.sleep(max(0, (start - mono_ns()) / 1e9))
    stats["open"] = True
    cpu0 = time.process_time()
    for t in ts:
        t.start()
    sys.stdin.readline()  # the coordinator's stop (or EOF)
    cpu1 = time.process_time()
    stats["open"] = False
    with mu:
        state["stopped"] = True
    deadline = time.monotonic() + 5
    while state["in_cs"] and time.monotonic() < deadline:
        time.sleep(0.001)
    print(json.dumps({"ev": "result", "holds": list(holds), "cpu_s": cpu1 - cpu0,
                      "attempts": stats["attempts"], "wakeups": stats["wakeups"],
                      "errors": errs["n"], "first_error": errs["first"]}), flush=True)
    # Waiters still blocked in acquire() cannot be interrupted: leave without them.
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# Servers.

def start_redis(tmp):
    port = free_port()
    p = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--maxclients", "15000", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return p, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def start_zookeeper(tmp):
    # As bench/waiters/run.sh's: no bound on connections per client address.
    port = free_port()
    with open(os.path.join(tmp, "zoo.cfg"), "w") as f:
        f.write(f"tickTime=2000\ndataDir={tmp}/data\nclientPort={port}\n"
                "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nforceSync=no\n"
                "admin.enableServer=false\n4lw.commands.whitelist=ruok\n")
    cp = "/usr/share/java/zookeeper.jar"
    if os.path.exists("/usr/share/java/slf4j-simple.jar"):
        cp += ":/usr/share/java/slf4j-simple.jar"
    log = open(os.path.join(tmp, "log"), "w")
    p = subprocess.Popen(
        ["java", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
         "-Djava.net.preferIPv4Stack=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
         f"-Dzookeeper.log.dir={tmp}", "-cp", cp,
         "org.apache.zookeeper.server.quorum.QuorumPeerMain", os.path.join(tmp, "zoo.cfg")],
        stdout=log, stderr=log)
    for _ in range(600):
        try:
            s = socket.create_connection(("127.0.0.1", port), 1)
            s.sendall(b"ruok")
            if s.recv(4) == b"imok":
                s.close()
                return p, f"127.0.0.1:{port}"
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("ZooKeeper did not start")


def start_etcd(tmp):
    # As distlock-testkit's single node (etcd 3.4 from Debian's etcd-server): heartbeat 50 ms,
    # election 500 ms, no v2 API.
    port, peer_port = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
    log = open(os.path.join(tmp, "log"), "w")
    p = subprocess.Popen(
        ["etcd", "--name", "m0", "--data-dir", os.path.join(tmp, "data"),
         "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
         "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
         "--initial-cluster", f"m0={peer_url}", "--initial-cluster-state", "new",
         "--initial-cluster-token", f"waiters-peers-{os.getpid()}",
         "--heartbeat-interval", "50", "--election-timeout", "500",
         "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
         "--enable-v2=false", "--snapshot-count", "10000"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={
            k: v for k, v in os.environ.items() if not k.startswith("ETCD_")})
    for _ in range(600):
        if p.poll() is not None:
            break
        try:
            with urllib.request.urlopen(client_url + "/health", timeout=1) as r:
                if json.load(r).get("health") == "true":
                    return p, client_url
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise SystemExit("etcd did not start")


SERVERS = {"redis": start_redis, "zookeeper": start_zookeeper, "etcd": start_etcd}


def percentile(sorted_ns, p):
    if not sorted_ns:
        return None
    return sorted_ns[round((len(sorted_ns) - 1) * p)] / 1e3


def coordinate(a):
    tmp = tempfile.mkdtemp(prefix="waiters-peers-")
    server = None
    workers = []
    try:
        backend = PEERS[a.peer].backend
        server, url = SERVERS[backend](tmp)
        counter = os.path.join(tmp, "counter")
        with open(counter, "w") as f:
            f.write("0")
        procs = min(a.procs, a.waiters)
        for i in range(procs):
            n = a.waiters // procs + (1 if i < a.waiters % procs else 0)
            if getattr(PEERS[a.peer], "node", False):
                cmd = ["node", os.path.join(HERE, "node", "worker.js")]
            elif getattr(PEERS[a.peer], "cmd", None):
                cmd = list(PEERS[a.peer].cmd)
            else:
                cmd = [sys.executable, __file__, "--worker"]
            workers.append(subprocess.Popen(
                cmd + ["--peer", a.peer, "--url", url, "--waiters", str(n), "--counter", counter,
                       "--requeue", a.requeue],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for w in workers:
            line = w.stdout.readline()
            if '"ready"' not in line:
                raise SystemExit(f"a worker did not get ready: {line.strip()!r}")
        start = mono_ns() + 200_000_000
        for w in workers:
            w.stdin.write(f"start {start}\n")
            w.stdin.flush()
        while mono_ns() < start:
            time.sleep(0.001)
        server0 = proc_cpu_s(server.pid)
        t0 = time.monotonic()
        while time.monotonic() - t0 < a.time and read_counter(counter) < a.handoffs + 1:
            time.sleep(0.02)
        for w in workers:
            w.stdin.write("stop\n")
            w.stdin.flush()
        stop = mono_ns()
        seconds = time.monotonic() - t0
        server1 = proc_cpu_s(server.pid)
        holds, client_cpu, attempts, wakeups, errors, first_error = [], 0.0, 0, 0, 0, None
        for i, w in enumerate(workers):
            line = w.stdout.readline()
            if not line:
                raise SystemExit("a worker ended without its result")
            r = json.loads(line)
            holds += [(t1, t2, (i << 32) | h, t0) for t0, t1, t2, h in r["holds"]]
            client_cpu += r["cpu_s"]
            attempts += r["attempts"]
            wakeups += r["wakeups"]
            errors += r["errors"]
            first_error = first_error or r["first_error"]
        exclusive = read_counter(counter) == len(holds)
        holds.sort()
        lat, reacquired, found_free = [], 0, 0
        for prev, nxt in zip(holds, holds[1:]):
            exclusive &= nxt[0] >= prev[1]
            if nxt[0] > stop:
                continue
            if nxt[2] == prev[2]:
                reacquired += 1
            elif nxt[3] >= prev[1]:
                # The next holder called acquire() only after the release: it found the key
                # free and did not wait, which is no hand-over either.
                found_free += 1
            else:
                lat.append(nxt[0] - prev[1])
        lat.sort()
        n = len(lat)

        def per(x):
            return round(x / n, 2) if n else None
        return {
            "backend": backend, "client": PEERS[a.peer].client,
            "client_version": PEERS[a.peer](a.peer, url, {}).version(),
            "waiters": a.waiters,
            "handoff_p50_us": percentile(lat, 0.5), "handoff_p99_us": percentile(lat, 0.99),
            "server_cpu_us_per_handoff": per((server1 - server0) * 1e6)
            if server0 is not None and server1 is not None else None,
            "client_cpu_us_per_handoff": per(client_cpu * 1e6),
            "wakeups_per_handoff": per(wakeups),
            "layout": "spread", "max_poll_s": None, "query": None, "procs": procs,
            "handoffs": n, "reacquired": reacquired, "found_free": found_free, "seconds": round(seconds, 2),
            "attempts_per_handoff": per(attempts), "wait_polls_per_handoff": None,
            "exclusive": exclusive, "errors": errors, "first_error": first_error,
            "server_pid": server.pid, "loadavg": loadavg(), "wait": PEERS[a.peer].wait,
            "requeue": a.requeue,
        }
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGKILL)
            w.wait()
        if server is not None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer", required=True, choices=sorted(PEERS))
    p.add_argument("--waiters", type=int, required=True)
    p.add_argument("--procs", type=int, default=10)
    p.add_argument("--handoffs", type=int, default=2000)
    p.add_argument("--time", type=float, default=20)
    p.add_argument("--requeue", default="after-handover", choices=["after-handover", "at-once"])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--url")
    p.add_argument("--counter")
    a = p.parse_args()
    if a.worker:
        worker(a)
    else:
        print(json.dumps(coordinate(a)), flush=True)


if __name__ == "__main__":
    main()
