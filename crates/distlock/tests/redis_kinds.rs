//! Read-write locks and semaphores on a real `redis-server`, as other clients see them: the
//! Redisson `RReadWriteLock` layout on the wire (driven by scripts that act as Redisson's
//! read and write locks do, written from the layout's description), `SET NX` clients kept out,
//! readers whose lease ran out pruned, the semaphore's layout and its permit count, listing;
//! and faults: a server restarted empty, a holder cut off past its lease, a short cut.
//! The semaphore's tests are in `redis_kinds/semaphore.rs`, the faults in `redis_kinds/faults.rs`.

#[path = "redis_kinds/faults.rs"]
mod faults;
#[path = "redis_kinds/semaphore.rs"]
mod semaphore;

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::redis::RedisBackend;
use distlock::{Backend, Error, LockKind, LockRegistry, RegistryOptions};
use distlock_testkit::proxy::FaultProxy;
use distlock_testkit::redis::RedisServer;
use distlock_testkit::timing;
use futures_util::StreamExt;

async fn registry(url: &str, opts: RegistryOptions) -> LockRegistry {
    let backend: Arc<dyn Backend> = Arc::new(RedisBackend::connect(url).await.expect("connect"));
    LockRegistry::from_backend(backend, opts).unwrap()
}

fn lease(ms: u64) -> RegistryOptions {
    RegistryOptions::default().with_lease(Duration::from_millis(ms))
}

fn busy<T: std::fmt::Debug>(res: distlock::Result<T>, what: &str) {
    match res {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("{what}: expected NotAcquired, got {other:?}"),
    }
}

/// A Redisson read lock's acquisition (KEYS lock, `{lock}:<id>:<tid>:rwlock_timeout`; ARGV
/// lease ms, `<id>:<tid>`, `<id>:<tid>:write`): nil when taken, the lock's PTTL when refused.
const REDISSON_READ: &str = r"
local mode = redis.call('HGET', KEYS[1], 'mode')
if not mode then
  redis.call('HSET', KEYS[1], 'mode', 'read', ARGV[2], 1)
  redis.call('SET', KEYS[2] .. ':1', 1, 'PX', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('HEXISTS', KEYS[1], ARGV[3]) == 1) then
  local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('SET', KEYS[2] .. ':' .. n, 1, 'PX', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[1])))
  return nil
end
return redis.call('PTTL', KEYS[1])
";

/// A Redisson write lock's acquisition (KEYS lock; ARGV lease ms, `<id>:<tid>:write`).
const REDISSON_WRITE: &str = r"
local mode = redis.call('HGET', KEYS[1], 'mode')
if not mode then
  redis.call('HSET', KEYS[1], 'mode', 'write', ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], redis.call('PTTL', KEYS[1]) + ARGV[1])
  return nil
end
return redis.call('PTTL', KEYS[1])
";

/// A Redisson read unlock (KEYS lock, channel, `{lock}:<id>:<tid>:rwlock_timeout`, `{lock}`;
/// ARGV `<id>:<tid>`): the lock's PTTL becomes the longest of the readers' timeout keys, the
/// hash goes (and `0` is published) when none is left.
const REDISSON_READ_UNLOCK: &str = r"
local mode = redis.call('HGET', KEYS[1], 'mode')
if not mode then redis.call('PUBLISH', KEYS[2], 0) return 1 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return nil end
local c = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if c == 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('DEL', KEYS[3] .. ':' .. (c + 1))
if redis.call('HLEN', KEYS[1]) > 1 then
  local longest = -3
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    local n = tonumber(redis.call('HGET', KEYS[1], f))
    if n then
      for i = n, 1, -1 do
        longest = math.max(longest, redis.call('PTTL', KEYS[4] .. ':' .. f .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then redis.call('PEXPIRE', KEYS[1], longest) return 0 end
  if mode == 'write' then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], 0)
return 1
";

/// A Redisson write unlock (KEYS lock, channel; ARGV `<id>:<tid>:write`).
const REDISSON_WRITE_UNLOCK: &str = r"
local mode = redis.call('HGET', KEYS[1], 'mode')
if not mode then redis.call('PUBLISH', KEYS[2], 1) return 1 end
if mode ~= 'write' or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return nil end
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) > 0 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], 1)
else
  redis.call('HSET', KEYS[1], 'mode', 'read')
end
return 1
";

/// A read lock's watchdog renewal as Redisson up to 4.3 does it (KEYS lock, `{lock}`; ARGV
/// lease ms, `<id>:<tid>`): it extends every reader's timeout keys, not only its own.
const OLD_REDISSON_READ_RENEWAL: &str = r"
if not redis.call('HGET', KEYS[1], ARGV[2]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  local n = tonumber(redis.call('HGET', KEYS[1], f))
  if n then
    for i = n, 1, -1 do
      redis.call('PEXPIRE', KEYS[2] .. ':' .. f .. ':rwlock_timeout:' .. i, ARGV[1])
    end
  end
end
return 1
";

/// A Redisson client's view of the read-write lock at `key` (no `{` in it).
struct Redisson<'a> {
    server: &'a RedisServer,
    key: &'a str,
    /// `<uuid>:<thread id>`.
    holder: &'a str,
}

impl Redisson<'_> {
    fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> String {
        let n = keys.len().to_string();
        let mut cmd = vec!["EVAL", script, &n];
        cmd.extend(keys);
        cmd.extend(args);
        self.server.cli(&cmd).expect("script runs")
    }
    fn timeouts(&self) -> String {
        format!("{{{}}}:{}:rwlock_timeout", self.key, self.holder)
    }
    fn channel(&self) -> String {
        format!("redisson_rwlock:{{{}}}", self.key)
    }
    /// True when the read lock was taken.
    fn read(&self, lease_ms: u64) -> bool {
        let write = format!("{}:write", self.holder);
        let (lease, t) = (lease_ms.to_string(), self.timeouts());
        self.eval(
            REDISSON_READ,
            &[self.key, &t],
            &[&lease, self.holder, &write],
        ) == "(nil)"
    }
    fn write(&self, lease_ms: u64) -> bool {
        let write = format!("{}:write", self.holder);
        self.eval(
            REDISSON_WRITE,
            &[self.key],
            &[&lease_ms.to_string(), &write],
        ) == "(nil)"
    }
    fn read_unlock(&self) -> String {
        let (c, t, p) = (self.channel(), self.timeouts(), format!("{{{}}}", self.key));
        self.eval(
            REDISSON_READ_UNLOCK,
            &[self.key, &c, &t, &p],
            &[self.holder],
        )
    }
    fn write_unlock(&self) -> String {
        let write = format!("{}:write", self.holder);
        self.eval(
            REDISSON_WRITE_UNLOCK,
            &[self.key, &self.channel()],
            &[&write],
        )
    }
    fn old_renewal(&self, lease_ms: u64) {
        let p = format!("{{{}}}", self.key);
        self.eval(
            OLD_REDISSON_READ_RENEWAL,
            &[self.key, &p],
            &[&lease_ms.to_string(), self.holder],
        );
    }
}

/// A reader of `doc` in a process that dies at once: its share is neither renewed nor given
/// back, and ends after `lease_ms`. The registry (kept, as the dead process's would be) and
/// the reader's token.
async fn crashed_reader(server: &RedisServer, lease_ms: u64) -> (LockRegistry, distlock::Token) {
    let crashed = registry(&server.url(), lease(lease_ms).with_renew(false)).await;
    let dead = distlock_testkit::holds::read(&crashed, "doc").await;
    let token = dead.token();
    std::mem::forget(dead); // no release: the process died
    (crashed, token)
}

/// What `reg` sees of `doc`'s read-write lock, which must be held.
async fn doc_info(reg: &LockRegistry) -> distlock::LockInfo {
    let rw = reg.read_write("doc").unwrap();
    rw.read().inspect().await.unwrap().expect("doc is held")
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).unwrap().parse().unwrap()
}

fn fields(server: &RedisServer, key: &str) -> Vec<String> {
    let mut f: Vec<String> = server
        .cli(&["HKEYS", key])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    f.sort();
    f
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn set_nx_refused(server: &RedisServer, key: &str) -> bool {
    server
        .cli(&["SET", key, "spring-client", "NX", "PX", "5000"])
        .unwrap()
        == "(nil)"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hold_is_redissons_layout_and_keeps_set_nx_clients_out() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), lease(5000)).await;
    let r = reg.read_write("doc").unwrap().read().lock().await.unwrap();
    let token = r.token().to_string();
    assert_eq!(server.cli(&["TYPE", "lock:doc"]).unwrap(), "hash");
    assert_eq!(server.cli(&["HGET", "lock:doc", "mode"]).unwrap(), "read");
    assert_eq!(
        fields(&server, "lock:doc"),
        sorted(vec!["mode".to_owned(), token.clone()])
    );
    assert_eq!(server.cli(&["HGET", "lock:doc", &token]).unwrap(), "1");
    let timeout = format!("{{lock:doc}}:{token}:rwlock_timeout:1");
    // The hash first: read later, the timeout key's PTTL can only be lower for the same expiry.
    let hash_left = pttl(&server, "lock:doc");
    let left = pttl(&server, &timeout);
    assert!(left > 0 && left <= 5000, "timeout key PTTL {left}");
    assert!(hash_left >= left, "the hash lasts as long as its readers");
    // Spring, redis-py's Lock, redsync: SET NX fails while readers hold; so does our mutex.
    assert!(set_nx_refused(&server, "lock:doc"));
    let other = registry(&server.url(), RegistryOptions::default()).await;
    busy(
        other.obtain("doc").unwrap().try_lock().await,
        "mutex beside a reader",
    );
    busy(
        other.read_write("doc").unwrap().write().try_lock().await,
        "writer beside a reader",
    );
    r.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "lock:doc", &timeout]).unwrap(), "0");
    // A key with a hash tag keeps Redisson's naming: no braces added.
    let r = distlock_testkit::holds::read(&reg, "{user}:1").await;
    let timeout = format!("lock:{{user}}:1:{}:rwlock_timeout:1", r.token());
    assert!(pttl(&server, &timeout) > 0, "{timeout}");
    r.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_readers_share_with_ours_and_exclude_writers_both_ways() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), lease(5000)).await;
    let rw = reg.read_write("doc").unwrap();
    let java = Redisson {
        server: &server,
        key: "lock:doc",
        holder: "2f1c6f2e-9a7b-4f61-8c1e-3b2d6f0a9e11:57",
    };
    let ours = rw.read().lock().await.unwrap();
    assert!(java.read(3000), "a Redisson reader shares with ours");
    assert!(java.read(3000), "and re-enters");
    assert_eq!(server.cli(&["HGET", "lock:doc", java.holder]).unwrap(), "2");
    let other = Redisson {
        holder: "0d7e5b3a-1c2d-4e5f-8a9b-c0d1e2f3a4b5:1",
        ..java
    };
    assert!(
        !other.write(3000),
        "a Redisson writer waits for both readers"
    );
    ours.release().await.unwrap();
    // Redisson's reader still holds: the hash stays, with its reader's lease.
    let left = pttl(&server, "lock:doc");
    assert!(
        left > 0 && left <= 3000,
        "PTTL {left} after our reader left"
    );
    let writer = registry(&server.url(), RegistryOptions::default()).await;
    let w = writer.read_write("doc").unwrap();
    busy(
        w.write().try_lock().await,
        "our writer beside a Redisson reader",
    );
    assert_eq!(java.read_unlock(), "0");
    assert_eq!(
        java.read_unlock(),
        "1",
        "the last Redisson read unlock frees the key"
    );
    let g = w
        .write()
        .try_lock()
        .await
        .expect("free once every reader left");
    assert!(!java.read(3000), "a Redisson reader waits for our writer");
    assert!(!other.write(3000), "so does a Redisson writer");
    assert!(set_nx_refused(&server, "lock:doc"));
    assert_eq!(server.cli(&["HGET", "lock:doc", "mode"]).unwrap(), "write");
    assert_eq!(
        fields(&server, "lock:doc"),
        sorted(vec![format!("{}:write", g.token()), "mode".to_owned()])
    );
    g.release().await.unwrap();
    assert!(other.write(3000), "a Redisson writer once ours left");
    for (kind, attempt) in [
        ("reader", rw.read().try_lock().await),
        ("writer", w.write().try_lock().await),
        ("mutex", reg.obtain("doc").unwrap().try_lock().await),
        ("permit", reg.semaphore("doc", 2).unwrap().try_lock().await),
    ] {
        busy(attempt, &format!("our {kind} beside a Redisson writer"));
    }
    assert_eq!(other.write_unlock(), "1");
    distlock_testkit::holds::give_back(rw.read().try_lock().await, "free again").await;
}

/// The next message's payload.
async fn next(messages: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin)) -> String {
    let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("a message")
        .unwrap();
    msg.get_payload::<String>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_are_published_on_redissons_channel() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let client = redis::Client::open(server.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe("redisson_rwlock:{lock:doc}")
        .await
        .unwrap();
    let mut messages = pubsub.on_message();
    let (a, b) = (
        registry(&server.url(), RegistryOptions::default()).await,
        registry(&server.url(), RegistryOptions::default()).await,
    );
    let r1 = a.read_write("doc").unwrap().read().lock().await.unwrap();
    let r2 = b.read_write("doc").unwrap().read().lock().await.unwrap();
    r1.release().await.unwrap();
    server
        .cli(&["PUBLISH", "redisson_rwlock:{lock:doc}", "marker"])
        .unwrap();
    assert_eq!(
        next(&mut messages).await,
        "marker",
        "a reader left while another holds: no message"
    );
    r2.release().await.unwrap();
    assert_eq!(next(&mut messages).await, "0", "the last read unlock");
    let w = a.read_write("doc").unwrap().write().lock().await.unwrap();
    w.release().await.unwrap();
    assert_eq!(next(&mut messages).await, "1", "a write unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_lease_ran_out_is_pruned_while_others_renew() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let (_crashed, dead_token) = crashed_reader(&server, 300).await;
    let dead_token = dead_token.to_string();
    let live = registry(&server.url(), lease(600)).await;
    let r = live.read_write("doc").unwrap().read().lock().await.unwrap();
    // A Redisson reader that crashes too, with a short lease.
    let java = Redisson {
        server: &server,
        key: "lock:doc",
        holder: "6a0b1c2d-3e4f-4a5b-9c6d-7e8f9a0b1c2d:9",
    };
    assert!(java.read(300));
    // Past both crashed leases, while ours renews (a third of 600 ms) several times.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(r.is_held());
    let t = |who: &str| format!("{{lock:doc}}:{who}:rwlock_timeout:1");
    assert_eq!(
        pttl(&server, &t(&dead_token)),
        -2,
        "our renewal extended a crashed reader"
    );
    assert_eq!(
        pttl(&server, &t(java.holder)),
        -2,
        "our renewal extended Redisson's reader"
    );
    // The next attempt on the key prunes them; the live reader stays.
    let writer = registry(&server.url(), RegistryOptions::default()).await;
    let w = writer.read_write("doc").unwrap();
    busy(w.write().try_lock().await, "writer beside the live reader");
    assert_eq!(
        fields(&server, "lock:doc"),
        sorted(vec!["mode".to_owned(), r.token().to_string()])
    );
    let info = doc_info(&live).await;
    assert_eq!((info.kind, info.holders), (Some(LockKind::Read), Some(1)));
    r.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "lock:doc"]).unwrap(), "0");
    distlock_testkit::holds::give_back(w.write().try_lock().await, "free").await;
}

/// Redisson up to 4.3 renews every reader's timeout keys, so a crashed reader's share (ours
/// too) lasts as long as a Redisson reader renews: the pitfall docs/BACKENDS.md describes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_redisson_renewal_keeps_every_readers_share_alive() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let (_crashed, dead) = crashed_reader(&server, 400).await;
    let timeout = format!("{{lock:doc}}:{dead}:rwlock_timeout:1");
    let java = Redisson {
        server: &server,
        key: "lock:doc",
        holder: "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a:3",
    };
    // Redisson's watchdog renews to its own lease, every reader's keys with it.
    assert!(java.read(2000));
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1000) {
        java.old_renewal(2000);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        pttl(&server, &timeout) > 0,
        "old Redisson renewals keep our crashed reader"
    );
    assert_eq!(java.read_unlock(), "0", "our crashed reader still counts");
    let reg = registry(&server.url(), RegistryOptions::default()).await;
    let limit = Duration::from_millis(2000) + timing::scheduling_slack().await;
    let w = reg.read_write("doc").unwrap();
    distlock_testkit::holds::give_back(
        w.write().try_lock_for(limit).await,
        "free once the renewals stopped and its lease ran out",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_queued_and_keeps_new_readers_out_until_it_leaves() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let (a, b, c) = (
        registry(&server.url(), RegistryOptions::default()).await,
        registry(&server.url(), RegistryOptions::default()).await,
        registry(&server.url(), RegistryOptions::default()).await,
    );
    let r = a.read_write("doc").unwrap().read().lock().await.unwrap();
    let w = b.read_write("doc").unwrap();
    let waiting = tokio::spawn(async move { w.write().lock().await.map(|g| g.token()) });
    let queue = "{lock:doc}:queue";
    let settle = timing::scheduling_slack().await;
    let started = std::time::Instant::now();
    while server.cli(&["ZCARD", queue]).unwrap() != "1" {
        assert!(started.elapsed() < settle * 10, "the writer never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let member = server.cli(&["ZRANGE", queue, "0", "0"]).unwrap();
    let place = server
        .cli(&["HGET", "{lock:doc}:waiters", &member])
        .unwrap();
    assert!(place.ends_with(":w"), "a writer's place: {place}");
    busy(
        c.read_write("doc").unwrap().read().try_lock().await,
        "a new reader while a writer waits",
    );
    let info = doc_info(&c).await;
    assert_eq!(info.waiters, Some(1));
    waiting.abort();
    let _ = waiting.await;
    let r2 = c
        .read_write("doc")
        .unwrap()
        .read()
        .try_lock_for(settle)
        .await
        .expect("readers go once the writer gave up");
    r.release().await.unwrap();
    r2.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_held_keys_of_the_prefix_and_no_bookkeeping() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let reg = registry(&server.url(), RegistryOptions::default()).await;
    let tagged = RegistryOptions::default().with_prefix("{t}");
    let tag = registry(&server.url(), tagged).await;
    let globby = registry(&server.url(), RegistryOptions::default().with_prefix("l*")).await;
    let held = [
        reg.read_write("{user}:1")
            .unwrap()
            .read()
            .lock()
            .await
            .unwrap(),
        reg.obtain("plain").unwrap().lock().await.unwrap(),
        reg.semaphore("pool", 2).unwrap().lock().await.unwrap(),
        tag.read_write("x").unwrap().read().lock().await.unwrap(),
        tag.obtain("y").unwrap().lock().await.unwrap(),
        globby.obtain("z").unwrap().lock().await.unwrap(),
    ];
    let keys = |prefix: &'static str| {
        let backend = &backend;
        async move {
            let mut k: Vec<String> = backend
                .list(prefix)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.key)
                .collect();
            k.sort();
            k
        }
    };
    assert_eq!(keys("lock").await, ["plain", "pool", "{user}:1"]);
    assert_eq!(keys("{t}").await, ["x", "y"]);
    assert_eq!(
        keys("l*").await,
        ["z"],
        "glob characters in a prefix are literal"
    );
    for g in held {
        g.release().await.unwrap();
    }
    assert!(keys("lock").await.is_empty());
}
