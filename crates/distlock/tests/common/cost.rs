//! The cost of an uncontended cycle of each kind beside a mutex cycle, for the ignored
//! measurement tests of the queue backends (ZooKeeper, etcd). They print figures and assert
//! nothing about time.

#![allow(dead_code)]

use std::time::Duration;

use distlock::LockRegistry;
use tokio::time::Instant;

/// Medians of `rounds` uncontended cycles (try_lock, then release) of `reg`: the mutex, a read
/// lock and a semaphore permit, each on a key of its own, interleaved in a rotating order so
/// that the machine's load falls on all alike. Prints them and the ratios to the mutex.
pub async fn print_cycle_costs(backend: &str, reg: &LockRegistry, rounds: usize) {
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mutex = reg.obtain("cost-mutex").unwrap();
    let rw = reg.read_write("cost-read").unwrap();
    let sem = reg.semaphore("cost-permit", 4).unwrap();
    for i in 0..rounds + 10 {
        for k in 0..3 {
            let kind = (i + k) % 3;
            let t = Instant::now();
            match kind {
                0 => mutex.try_lock().await.unwrap().release().await.unwrap(),
                1 => rw.read().try_lock().await.unwrap().release().await.unwrap(),
                _ => sem.try_lock().await.unwrap().release().await.unwrap(),
            };
            // The first rounds warm up connections, sessions and the server.
            if i >= 10 {
                times[kind].push(t.elapsed());
            }
        }
    }
    let [m, r, p] = times.map(median);
    println!(
        "{backend}: uncontended cycle (try_lock + release), median of {rounds}: mutex {m:?}, \
         read {r:?} ({:.2}x the mutex), permit {p:?} ({:.2}x)",
        r.as_secs_f64() / m.as_secs_f64(),
        p.as_secs_f64() / m.as_secs_f64()
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}
