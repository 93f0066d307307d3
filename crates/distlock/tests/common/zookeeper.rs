//! Helpers shared by the ZooKeeper test binaries (`zookeeper`, `zookeeper_faults`,
//! `zookeeper_tls`): the shared server, a root per test, backends and registries on it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use distlock::backends::zookeeper::{zookeeper_client, ZooKeeperBackend};
use distlock::{Backend, LockRegistry, RegistryOptions, Token};
use distlock_testkit::zookeeper::ZooKeeperServer;

pub fn shared() -> Arc<ZooKeeperServer> {
    ZooKeeperServer::shared().expect("ZooKeeper must be installed (apt-get install zookeeper)")
}

/// A root of this test's own.
pub fn root() -> String {
    format!("/t{:016x}", rand_u64())
}

pub fn rand_u64() -> u64 {
    Token::random().as_u128() as u64
}

pub async fn backend(url: &str) -> Arc<ZooKeeperBackend> {
    Arc::new(ZooKeeperBackend::connect(url).await.expect("connect"))
}

pub fn registry(b: &Arc<ZooKeeperBackend>, opts: RegistryOptions) -> LockRegistry {
    LockRegistry::from_backend(b.clone() as Arc<dyn Backend>, opts).unwrap()
}

pub fn lease(ms: u64) -> RegistryOptions {
    RegistryOptions::default().with_lease(Duration::from_millis(ms))
}

/// `_c_<8-4-4-4-12 hex>-lock-<10 digits>`.
pub fn is_curator_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let (uuid, tail) = rest.split_at(36.min(rest.len()));
    let groups: Vec<&str> = uuid.split('-').collect();
    let uuid_ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| {
            g.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        });
    let seq_ok = tail
        .strip_prefix("-lock-")
        .is_some_and(|s| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()));
    uuid_ok && seq_ok
}

/// Takes the lock `key` of `reg` at once and releases it again: it was free, and works.
pub async fn lock_and_release(reg: &LockRegistry, key: &str) {
    let guard = reg.obtain(key).unwrap().try_lock().await.unwrap();
    guard.release().await.unwrap();
}

/// The ACL of the node at `path`, as the backend's own client reads it.
pub async fn acl(b: &ZooKeeperBackend, path: &str) -> Vec<zookeeper_client::Acl> {
    b.client().await.unwrap().get_acl(path).await.unwrap().0
}
