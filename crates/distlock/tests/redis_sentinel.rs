//! Redis under Sentinel (one master, two replicas, three Sentinels, all throwaway): holds and
//! fences across a manual failover and across the master's `kill -9`, `min_replicas`, and URL
//! errors.

#[path = "common/redis.rs"]
mod redis_common;

use std::time::Duration;

use distlock::backends::redis::RedisBackend;
use distlock::Error;
use distlock_testkit::redis::sentinel::SentinelSet;

use redis_common::{
    extend_after_failover, holder_and_slow_waiter, min_replicas_beyond_the_replicas,
    next_fence_above, registry, take_and_release, take_when_replicated, try_after_failover,
    while_unavailable,
};

fn set() -> SentinelSet {
    SentinelSet::start(2).expect("redis-server must be installed (scripts/test.sh installs it)")
}

/// Holds `job` across `fail` (a failover of some kind): the hold is kept, nobody else gets the
/// lock meanwhile, and the next holder's fence is higher.
async fn hold_across(set: &SentinelSet, lease: Duration, fail: impl FnOnce(&SentinelSet)) {
    let url = set.url();
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    let g = holder.obtain("job").unwrap().lock().await.unwrap();
    let first = g.fence();
    let old = set.master();
    fail(set);
    let new = tokio::task::block_in_place(|| set.await_new_master(old)).expect("failover");
    assert_ne!(Some(new), old);
    // Once a replica follows the new master, renewals (which wait for one) succeed again; a
    // third of the lease later one has.
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("a replica follows");
    tokio::time::sleep(lease / 2).await;
    assert!(g.is_held(), "the acknowledged hold survives the failover");
    let attempt = try_after_failover(&other, 50).await;
    assert!(
        matches!(attempt, Err(Error::NotAcquired { .. })),
        "{attempt:?}"
    );
    g.release().await.unwrap();
    next_fence_above(&other, first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_its_fence_survive_a_manual_failover() {
    let set = set();
    hold_across(&set, Duration::from_secs(15), |s| {
        s.failover().expect("SENTINEL FAILOVER");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_its_fence_survive_the_master_killed() {
    let mut set = set();
    let master = set.master().expect("a master");
    // Sentinel needs about 1 s to see the master down and a few more to promote a replica:
    // the lease outlasts that, so renewals that fail meanwhile do not end the hold.
    let lease = Duration::from_secs(15);
    let url = set.url();
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    let g = holder.obtain("job").unwrap().lock().await.unwrap();
    let first = g.fence();
    set.servers[master].kill();
    let new = tokio::task::block_in_place(|| set.await_new_master(Some(master)))
        .expect("failover after kill -9");
    assert_ne!(new, master);
    assert!(g.is_held());
    // The new master knows the holder: a try fails, and so does a foreign SET NX.
    let attempt = try_after_failover(&other, 50).await;
    assert!(
        matches!(attempt, Err(Error::NotAcquired { .. })),
        "{attempt:?}"
    );
    assert_ne!(
        set.servers[new]
            .cli(&["SET", "lock:job", "foreign", "NX", "PX", "60000"])
            .unwrap(),
        "OK"
    );
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("a replica follows");
    // The first request may meet a connection to the dead master; the next one goes to the
    // new master.
    extend_after_failover(&g, lease, 21).await;
    g.release().await.unwrap();
    next_fence_above(&other, first).await;
}

/// A waiter that subscribed on the old master is woken by a release on the new one long before
/// its first poll: the backend follows `+switch-master` (and a pub/sub connection the demoted
/// master dropped) and subscribes again on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_on_the_new_master_after_a_failover() {
    let set = set();
    // Wake-ups are what this test is about, not replication: the demoted master may still be
    // resyncing as the new master's replica when the waiter takes the lock, and a `WAIT` for it
    // would time out on a loaded machine.
    let url = format!("{}?min_replicas=0", set.url());
    let poll = Duration::from_secs(120);
    let (holder, waiter) = holder_and_slow_waiter(&url, poll).await;
    let g = holder.obtain("job").unwrap().lock().await.unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.obtain("job").unwrap().lock().await });
    // Long enough for the waiter to find the lock busy and subscribe, on the old master.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    tokio::task::block_in_place(|| set.failover()).expect("SENTINEL FAILOVER");
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("a replica follows");
    g.release().await.expect("released on the new master");
    let at = std::time::Instant::now();
    // The first poll comes a quarter of the poll interval after an attempt.
    let bound = Duration::from_secs(5) + distlock_testkit::timing::scheduling_slack().await;
    let next = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not woken within {bound:?} of the release"))
        .unwrap()
        .expect("the waiter holds the lock");
    assert!(at.elapsed() < poll / 4);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_beyond_the_replicas_fails_clearly_and_holds_nothing() {
    min_replicas_beyond_the_replicas(&set().url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_urls_give_clear_errors() {
    let set = set();
    let sentinels = set.url();
    let hosts = sentinels
        .trim_start_matches("redis+sentinel://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    for (url, part) in [
        (format!("redis+sentinel://{hosts}"), "master's name"),
        (
            format!("redis+sentinel://{hosts}/mymaster?bogus=1"),
            "bogus",
        ),
        (
            format!("redis+sentinel://{hosts}/mymaster?min_replicas=x"),
            "min_replicas",
        ),
    ] {
        match RedisBackend::connect(&url).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains(part), "{url}: {msg}"),
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }
    match RedisBackend::connect(&format!("redis+sentinel://{hosts}/nosuchmaster")).await {
        Err(Error::Backend { message, .. }) => {
            assert!(message.contains("nosuchmaster"), "{message}")
        }
        other => panic!("unknown master: expected a backend error, got {other:?}"),
    }
    match RedisBackend::connect("redis+sentinel://127.0.0.1:1/mymaster").await {
        Err(Error::Unavailable { message, .. }) => {
            assert!(message.contains("no Sentinel answered"), "{message}")
        }
        other => panic!("no Sentinel: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_and_permits_wait_for_replicas_and_survive_a_failover() {
    let set = set();
    let beyond = format!("{}?min_replicas=3&replica_timeout=200ms", set.url());
    let strict = registry(&beyond, Duration::from_secs(5)).await;
    for res in [
        strict.read_write("doc").unwrap().read().try_lock().await,
        strict.semaphore("pool", 2).unwrap().try_lock().await,
    ] {
        match res {
            Err(Error::Unavailable { message, .. }) => {
                assert!(message.contains("min_replicas"), "{message}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    let lease = Duration::from_secs(15);
    let url = set.url();
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    // The unreplicated attempts gave their tokens back: the keys are free.
    let r = distlock_testkit::holds::read(&holder, "doc").await;
    let p = holder.semaphore("pool", 1).unwrap().lock().await.unwrap();
    let fences = (r.fence(), p.fence());
    let old = set.master();
    set.failover().expect("SENTINEL FAILOVER");
    let new = tokio::task::block_in_place(|| set.await_new_master(old)).expect("failover");
    let master = &set.servers[new];
    assert_eq!(
        master
            .cli(&["HGET", "lock:doc", &r.token().to_string()])
            .unwrap(),
        "1",
        "the promoted replica has the reader"
    );
    assert_eq!(
        master
            .cli(&["HEXISTS", "lock:pool", &p.token().to_string()])
            .unwrap(),
        "1",
        "the promoted replica has the permit"
    );
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("a replica follows");
    tokio::time::sleep(lease / 2).await;
    assert!(
        r.is_held() && p.is_held(),
        "acknowledged holds survive the failover"
    );
    let w = other.read_write("doc").unwrap();
    let attempt = while_unavailable(100, || w.write().try_lock()).await;
    assert!(
        matches!(attempt, Err(Error::NotAcquired { .. })),
        "{attempt:?}"
    );
    let sem = other.semaphore("pool", 1).unwrap();
    let attempt = while_unavailable(100, || sem.try_lock()).await;
    assert!(
        matches!(attempt, Err(Error::NotAcquired { .. })),
        "{attempt:?}"
    );
    r.release().await.unwrap();
    p.release().await.unwrap();
    let g = while_unavailable(100, || w.write().lock()).await.unwrap();
    let q = while_unavailable(100, || sem.lock()).await.unwrap();
    assert!(
        g.fence() > fences.0 && q.fence() > fences.1,
        "fences after the failover"
    );
    g.release().await.unwrap();
    q.release().await.unwrap();
}

/// A promoted replica may lack the last `INCR`s of a fence counter (`min_replicas` below the
/// number of replicas, or a write that no replica acknowledged in time): fences are floored at
/// the master's clock, so the next one is still higher. The rollback is made by hand here, on
/// the master itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_stay_increasing_when_the_counter_is_rolled_back() {
    let set = set();
    let reg = registry(&set.url(), Duration::from_secs(15)).await;
    // The counter as a replica that missed the last ten increments has it.
    let roll_back = || {
        let master = &set.servers[set.master().expect("a master")];
        let key = "{lock:job}:fence";
        let now: u64 = master
            .cli(&["GET", key])
            .unwrap()
            .parse()
            .expect("a counter");
        let older = (now - 10).to_string();
        assert_eq!(master.cli(&["SET", key, &older]).unwrap(), "OK");
    };
    let mut last = 0;
    // `lock` and `try_lock` take different paths (the queue script, `SET NX` then the fence).
    for step in ["lock", "try_lock", "lock"] {
        let g = if step == "lock" {
            take_when_replicated(&reg).await
        } else {
            reg.obtain("job").unwrap().try_lock().await.unwrap()
        };
        assert!(g.fence() > last, "{step}: fence {} after {last}", g.fence());
        last = g.fence();
        g.release().await.unwrap();
        roll_back();
    }
}

/// Passwords on the data nodes and on the Sentinels themselves: the URL carries both and
/// locks work through a failover (the replicas authenticate with `masterauth`); over plain
/// TCP they are refused unless the URL opts in, and a wrong password of either kind is a
/// permanent error that names no secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_of_the_sentinels_and_of_the_data_nodes_are_used() {
    use distlock_testkit::redis::sentinel::SentinelOptions;
    let set = tokio::task::block_in_place(|| {
        SentinelSet::start_with(
            2,
            SentinelOptions {
                password: Some("data-pw".into()),
                sentinel_password: Some("sentinel-pw".into()),
                ..SentinelOptions::default()
            },
        )
    })
    .expect("redis-server must be installed (scripts/test.sh installs it)");
    let url = set.url();
    assert!(url.contains(":data-pw@") && url.contains("sentinel_password=sentinel-pw"));
    assert!(url.contains("allow_insecure_auth=true"), "{url}");
    hold_across(&set, Duration::from_secs(15), |s| {
        s.failover().expect("failover");
    })
    .await;

    let refused = url.replace("&allow_insecure_auth=true", "");
    match RedisBackend::connect(&refused).await {
        Err(Error::InvalidConfig(m)) => {
            assert!(m.contains("allow_insecure_auth"), "{m}");
            assert!(!m.contains("data-pw") && !m.contains("sentinel-pw"), "{m}");
        }
        other => panic!("a password over plain TCP: expected a config error, got {other:?}"),
    }
    for (wrong, secret) in [
        (url.replace(":data-pw@", ":nope-data@"), "nope-data"),
        (
            url.replace(
                "sentinel_password=sentinel-pw",
                "sentinel_password=nope-sentinel",
            ),
            "nope-sentinel",
        ),
    ] {
        let e = RedisBackend::connect(&wrong)
            .await
            .expect_err("a wrong password was accepted");
        assert!(matches!(e, Error::Backend { .. }), "{wrong}: {e:?}");
        assert!(!format!("{e} {e:?}").contains(secret), "{e:?}");
    }
}

/// Whether `server` has run a `WAIT` since it started.
fn waited_on(server: &distlock_testkit::redis::RedisServer) -> bool {
    server
        .cli(&["INFO", "commandstats"])
        .unwrap()
        .contains("cmdstat_wait:")
}

/// `min_replicas` is decided again when the topology changes, not once at connect: a backend
/// that connected while the master's only replica was down (so no `WAIT`, with a warning)
/// makes its acquisitions wait for a replica once a new master that has one is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_is_decided_again_when_a_new_master_is_named() {
    let mut set = SentinelSet::start(1).expect("redis-server must be installed");
    set.servers[1].kill();
    let master = &set.servers[0];
    let since = std::time::Instant::now();
    while !master
        .cli(&["INFO", "replication"])
        .unwrap()
        .contains("connected_slaves:0")
    {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the replica stays"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reg = registry(&set.url(), Duration::from_secs(10)).await;
    take_and_release(reg.obtain("job")).await;
    assert!(!waited_on(&set.servers[0]), "no replica to wait for");
    set.servers[1].restart().expect("the replica comes back");
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("in sync");
    // The Sentinels accept the restarted replica for promotion once they have seen it up.
    let since = std::time::Instant::now();
    let new = loop {
        match tokio::task::block_in_place(|| set.failover()) {
            Ok(new) => break new,
            Err(e) if e.to_string().contains("NOGOODSLAVE") => {
                assert!(since.elapsed() < Duration::from_secs(60), "{e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("failover: {e}"),
        }
    };
    tokio::task::block_in_place(|| set.await_replicas(1)).expect("the old master follows");
    let g = take_when_replicated(&reg).await;
    assert!(
        waited_on(&set.servers[new]),
        "the acquisition on the new master waited for its replica"
    );
    g.release().await.unwrap();
}
