//! Holder descriptions on the Redis layout as other clients see it: the lock key stays the
//! bare token (what `SET NX PX` clients, redis-py's `Lock` and Spring compare), the
//! description lives in the `{<lock key>}:owners` hash beside it, and holders that recorded
//! none (a foreign client, a Redisson reader, a hold taken before descriptions were recorded)
//! show as unknown.

use std::sync::Arc;

use distlock::backends::redis::RedisBackend;
use distlock::{Backend, LockRegistry, Owner, RegistryOptions, UNKNOWN_OWNER};
use distlock_testkit::redis::RedisServer;

async fn registry(url: &str, owner: &str) -> LockRegistry {
    let backend: Arc<dyn Backend> = Arc::new(RedisBackend::connect(url).await.expect("connect"));
    let opts = RegistryOptions::default().with_owner(Owner::new(owner).unwrap());
    LockRegistry::from_backend(backend, opts).unwrap()
}

async fn owners(reg: &LockRegistry, key: &str) -> Vec<String> {
    let info = reg.obtain(key).unwrap().inspect().await.unwrap();
    info.map(|i| i.owners).unwrap_or_default()
}

async fn listed_owners(reg: &LockRegistry, key: &str) -> Vec<String> {
    let listed = reg.backend().list("lock").await.unwrap();
    let l = listed.iter().find(|l| l.key == key).expect("listed");
    l.info.owners.clone()
}

/// Compare-and-delete, as redis-py's `Lock` and every `SET NX PX` client release.
const FOREIGN_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[tokio::test]
async fn a_foreign_set_nx_holder_shows_as_unknown() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), "billing:7").await;
    // A distlock hold first, released by a foreign compare-and-delete: its description stays
    // behind until it expires, and must not be shown for the next, foreign, holder.
    let g = reg.obtain("voucher:1").unwrap().lock().await.unwrap();
    let token = g.token().to_string();
    assert_eq!(
        server
            .cli(&["EVAL", FOREIGN_RELEASE, "1", "lock:voucher:1", &token])
            .unwrap(),
        "1"
    );
    assert_eq!(
        server
            .cli(&["SET", "lock:voucher:1", "foreign", "NX", "PX", "5000"])
            .unwrap(),
        "OK"
    );
    assert_eq!(owners(&reg, "voucher:1").await, [UNKNOWN_OWNER]);
    assert_eq!(listed_owners(&reg, "voucher:1").await, [UNKNOWN_OWNER]);
    drop(g);
}

#[tokio::test]
async fn the_lock_key_stays_the_token_and_the_description_is_beside_it() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), "billing:7").await;
    let g = reg.obtain("voucher:2").unwrap().try_lock().await.unwrap();
    let token = g.token().to_string();
    assert_eq!(server.cli(&["TYPE", "lock:voucher:2"]).unwrap(), "string");
    assert_eq!(server.cli(&["GET", "lock:voucher:2"]).unwrap(), token);
    assert_eq!(
        server
            .cli(&["HGETALL", "{lock:voucher:2}:owners"])
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        [token.as_str(), "billing:7"]
    );
    assert_eq!(owners(&reg, "voucher:2").await, ["billing:7"]);
    // A foreign client still sees a plain `SET NX` lock: taken, with the token as its value.
    assert_eq!(
        server
            .cli(&["SET", "lock:voucher:2", "foreign", "NX", "PX", "5000"])
            .unwrap(),
        "(nil)"
    );
    g.release().await.unwrap();
    assert_eq!(
        server.cli(&["EXISTS", "{lock:voucher:2}:owners"]).unwrap(),
        "0",
        "the description outlived the hold"
    );
}

/// A hold taken by a distlock version that recorded no description (the bare token at the
/// key), and a Redisson reader beside a distlock reader: one entry per holder, unknown where
/// the layout records nothing.
#[tokio::test]
async fn holds_without_a_description_show_as_unknown() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), "reader-a:1").await;
    server
        .cli(&[
            "SET",
            "lock:old",
            "0123456789abcdef0123456789abcdef",
            "PX",
            "5000",
        ])
        .unwrap();
    assert_eq!(owners(&reg, "old").await, [UNKNOWN_OWNER]);

    let ours = distlock_testkit::holds::read(&reg, "shared").await;
    // A Redisson reader: field `<uuid>:<thread id>` = 1 and its timeout key.
    server
        .cli(&["HSET", "lock:shared", "6f1e:42", "1"])
        .unwrap();
    server
        .cli(&[
            "SET",
            "{lock:shared}:6f1e:42:rwlock_timeout:1",
            "1",
            "PX",
            "5000",
        ])
        .unwrap();
    assert_eq!(owners(&reg, "shared").await, ["reader-a:1", UNKNOWN_OWNER]);
    assert_eq!(
        listed_owners(&reg, "shared").await,
        ["reader-a:1", UNKNOWN_OWNER]
    );
    ours.release().await.unwrap();
    assert_eq!(owners(&reg, "shared").await, [UNKNOWN_OWNER]);
}

/// Descriptions of holds that ended without a release (their key expired) go when the key is
/// taken again: the owners hash holds the live holders' descriptions only.
#[tokio::test]
async fn descriptions_of_lost_holds_do_not_pile_up() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let (a, b) = (
        registry(&server.url(), "a:1").await,
        registry(&server.url(), "b:2").await,
    );
    let lost = a.obtain("k").unwrap().lock().await.unwrap();
    // The lease ran out on the server (the holder is gone): the key expires, its description
    // is left until the next hold.
    server.cli(&["DEL", "lock:k"]).unwrap();
    let g = b.obtain("k").unwrap().lock().await.unwrap();
    assert_eq!(server.cli(&["HLEN", "{lock:k}:owners"]).unwrap(), "1");
    assert_eq!(owners(&a, "k").await, ["b:2"]);
    g.release().await.unwrap();
    drop(lost);

    let r = a.read_write("r").unwrap().read().lock().await.unwrap();
    let token = r.token().to_string();
    server
        .cli(&["DEL", &format!("{{lock:r}}:{token}:rwlock_timeout:1")])
        .unwrap();
    let r2 = b.read_write("r").unwrap().read().lock().await.unwrap();
    assert_eq!(server.cli(&["HLEN", "{lock:r}:owners"]).unwrap(), "1");
    assert_eq!(owners(&a, "r").await, ["b:2"]);
    r2.release().await.unwrap();
    drop(r);
}

/// A waiter queued by a distlock version that recorded no description (its place alone, no
/// `<member>|o` field) is handed the lock as before, and shows as unknown once it holds.
#[tokio::test]
async fn a_waiter_queued_without_a_description_holds_as_unknown() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), "a:1").await;
    let g = reg.obtain("h").unwrap().lock().await.unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    let member = format!("{token}:00000000000000ab");
    server
        .cli(&["ZADD", "{lock:h}:queue", "1", &member])
        .unwrap();
    server
        .cli(&["HSET", "{lock:h}:waiters", &member, "99999999999999:30000"])
        .unwrap();
    g.release().await.unwrap();
    assert_eq!(
        server.cli(&["GET", "lock:h"]).unwrap(),
        token,
        "handed over"
    );
    assert_eq!(owners(&reg, "h").await, [UNKNOWN_OWNER]);
    assert_eq!(server.cli(&["EXISTS", "{lock:h}:owners"]).unwrap(), "0");
}
