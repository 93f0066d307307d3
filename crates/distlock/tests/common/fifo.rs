//! Waiters that record the order in which they got a lock, for the FIFO tests of every backend.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireMode, AcquireRequest, Attempt, Backend, LockName, LockRegistry, Token};
use tokio::task::JoinHandle;

/// The waiters' numbers, in the order they got the lock.
pub type Order = Arc<Mutex<Vec<usize>>>;

/// Spawns waiter `i`: it takes `key` from `reg`, records `i` in `order` once it holds the lock,
/// holds it for `hold` and releases it.
pub fn spawn_waiter(
    reg: LockRegistry,
    key: &'static str,
    i: usize,
    order: &Order,
    hold: Duration,
) -> JoinHandle<()> {
    let order = order.clone();
    tokio::spawn(async move {
        let g = reg.obtain(key).unwrap().lock().await.unwrap();
        order.lock().unwrap().push(i);
        tokio::time::sleep(hold).await;
        g.release().await.unwrap();
    })
}

/// One attempt on `backend` by a caller that will wait: a busy lock queues `token`.
pub async fn queued_attempt(
    backend: &(impl Backend + ?Sized),
    name: &LockName,
    token: Token,
    lease: Duration,
) -> Attempt {
    let request = AcquireRequest::new(name.clone(), token, lease);
    backend
        .acquire(&request.with_mode(AcquireMode::Queue))
        .await
        .unwrap()
}
