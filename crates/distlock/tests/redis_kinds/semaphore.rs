//! The semaphore on the wire: a hash of permits with their expiries in server time, and a
//! permit whose lease ran out pruned.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_is_a_hash_of_permits_with_server_time_expiries() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let reg = registry(&server.url(), lease(5000)).await;
    let sem = reg.semaphore("pool", 3).unwrap();
    let p1 = sem.lock().await.unwrap();
    let p2 = sem.lock().await.unwrap();
    let now_ms = || -> u64 {
        let t = server.cli(&["TIME"]).unwrap();
        let mut parts = t.lines().map(|p| p.parse::<u64>().unwrap());
        parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000
    };
    assert_eq!(
        server.cli(&["HGET", "lock:pool", "mode"]).unwrap(),
        "semaphore"
    );
    assert_eq!(server.cli(&["HGET", "lock:pool", "permits"]).unwrap(), "3");
    let mut slots = Vec::new();
    for p in [&p1, &p2] {
        let v = server
            .cli(&["HGET", "lock:pool", &p.token().to_string()])
            .unwrap();
        let (expiry, slot) = v.split_once(':').expect("<expiry ms>:<slot>");
        let left = expiry.parse::<u64>().unwrap().saturating_sub(now_ms());
        assert!(left > 0 && left <= 5000, "permit expires in {left} ms");
        slots.push(slot.to_owned());
    }
    slots.sort();
    assert_eq!(slots, ["0", "1"], "each live permit has its own slot");
    assert!(set_nx_refused(&server, "lock:pool"));
    busy(
        reg.obtain("pool").unwrap().try_lock().await,
        "mutex beside permits",
    );
    busy(
        reg.read_write("pool").unwrap().read().try_lock().await,
        "reader beside permits",
    );
    let java = Redisson {
        server: &server,
        key: "lock:pool",
        holder: "11111111-2222-4333-8444-555555555555:1",
    };
    assert!(!java.read(1000), "a Redisson reader waits for permits");
    match reg.semaphore("pool", 4).unwrap().try_lock().await {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains("permit"), "{msg}"),
        other => panic!("a taker with another number of permits got {other:?}"),
    }
    let info = sem.inspect().await.unwrap().unwrap();
    assert_eq!(info.kind, Some(LockKind::Semaphore { permits: 3 }));
    assert_eq!(info.holders, Some(2));
    p1.release().await.unwrap();
    p2.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "lock:pool"]).unwrap(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_lease_ran_out_is_pruned() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let crashed = registry(&server.url(), lease(300).with_renew(false)).await;
    let dead = crashed.semaphore("pool", 2).unwrap().lock().await.unwrap();
    let dead_token = dead.token().to_string();
    std::mem::forget(dead);
    let reg = registry(&server.url(), lease(600)).await;
    let live = reg.semaphore("pool", 2).unwrap().lock().await.unwrap();
    busy(
        reg.semaphore("pool", 2).unwrap().try_lock().await,
        "both permits taken",
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    let p = reg
        .semaphore("pool", 2)
        .unwrap()
        .try_lock()
        .await
        .expect("the crashed holder's permit came back");
    assert_eq!(
        server.cli(&["HEXISTS", "lock:pool", &dead_token]).unwrap(),
        "0"
    );
    assert!(live.is_held(), "the live permit renews on its own");
    p.release().await.unwrap();
    live.release().await.unwrap();
}
