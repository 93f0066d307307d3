//! Slot migrations: a hold kept and others refused while its slot moves (`ASK`), a release
//! that completes when the migration ends, and a client with an old slot map (`MOVED`).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_under_a_hold_keeps_it_and_refuses_others() {
    let mut set = cluster();
    // Short, so that renewals run while the slot is half-way (each renews at a third).
    let lease = Duration::from_secs(3);
    let url = set.url();
    let holder = registry(&url, lease).await;
    let other = registry(&url, lease).await;
    let g = holder.obtain("job").unwrap().lock().await.unwrap();
    let first = g.fence();
    let slot = set.slot_of(JOB).unwrap();
    let from = set.master_of(slot).unwrap();
    let to = (0..3).find(|m| *m != from).unwrap();
    let m = blocking(|| set.begin_migration(slot, to)).unwrap();
    let refused = |r: distlock::Result<LockGuard>| {
        assert!(matches!(r, Err(Error::NotAcquired { .. })), "{r:?}");
    };
    refused(other.obtain("job").unwrap().try_lock().await);
    // The fence counter moves first: the lock key on the source, the counter on the target.
    let fence_key = "{lock:job}:fence";
    blocking(|| set.move_keys(m, Some(&[fence_key]))).unwrap();
    refused(other.obtain("job").unwrap().try_lock().await);
    g.extend(lease).await.expect("extended on the source");
    blocking(|| set.move_keys(m, None)).unwrap();
    assert_eq!(set.nodes[from].cli(&["DBSIZE"]).unwrap(), "0");
    refused(other.obtain("job").unwrap().try_lock().await);
    g.extend(lease)
        .await
        .expect("extended on the target, by ASK");
    // Renewals alone keep it across more than a lease.
    tokio::time::sleep(lease + lease / 2).await;
    assert!(g.is_held(), "renewed through ASK redirections");
    blocking(|| set.finish_migration(m)).unwrap();
    refused(other.obtain("job").unwrap().try_lock().await);
    g.release()
        .await
        .expect("released after the migration (MOVED)");
    let next = other.obtain("job").unwrap().try_lock().await.unwrap();
    assert!(next.fence() > first, "fence {} after {first}", next.fence());
    assert_eq!(
        set.nodes[to].cli(&["EXISTS", JOB]).unwrap(),
        "1",
        "the new hold is on the slot's new master"
    );
    next.release().await.unwrap();
}

/// A script of a lock whose slot is migrating meets `TRYAGAIN` (its wait-queue keys do not
/// exist on either side): the client retries it and it runs once the migration ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_migration_completes_when_it_ends() {
    let mut set = cluster();
    let lease = Duration::from_secs(10);
    let url = set.url();
    let holder = registry(&url, lease).await;
    let g = holder.obtain("job").unwrap().lock().await.unwrap();
    let slot = set.slot_of(JOB).unwrap();
    let from = set.master_of(slot).unwrap();
    let to = (0..3).find(|m| *m != from).unwrap();
    let m = blocking(|| set.begin_migration(slot, to)).unwrap();
    blocking(|| set.move_keys(m, None)).unwrap();
    let release = tokio::spawn(g.release());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!release.is_finished(), "TRYAGAIN is retried, not reported");
    blocking(|| set.finish_migration(m)).unwrap();
    release
        .await
        .unwrap()
        .expect("released once the migration ended");
    assert_eq!(set.nodes[to].cli(&["EXISTS", JOB]).unwrap(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_an_old_slot_map_follows_moved() {
    let mut set = cluster();
    let url = set.url();
    let reg = registry(&url, Duration::from_secs(10)).await;
    let g = reg.obtain("job").unwrap().try_lock().await.unwrap();
    let first = g.fence();
    g.release().await.unwrap();
    let slot = set.slot_of(JOB).unwrap();
    let from = set.master_of(slot).unwrap();
    let to = (0..3).find(|m| *m != from).unwrap();
    blocking(|| set.migrate_slot(slot, to)).unwrap();
    let g = reg.obtain("job").unwrap().try_lock().await.unwrap();
    assert!(g.fence() > first, "the fence counter moved with the slot");
    assert_eq!(set.nodes[to].cli(&["EXISTS", JOB]).unwrap(), "1");
    g.release().await.unwrap();
}

/// The owners hash of a free key does not exist, and a script naming a missing key is refused
/// while its slot migrates: the uncontended acquisition records the holder's description with
/// a one-key script of its own, in its fence's pipeline, so it is not held up by a migration,
/// and its renewals keep the description as long as the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_during_a_migration_records_its_owner() {
    let mut set = cluster();
    let lease = Duration::from_secs(3);
    let url = set.url();
    let owner = distlock::Owner::new("migrating:1").unwrap();
    let reg = registry_with(
        &url,
        RegistryOptions::default()
            .with_lease(lease)
            .with_owner(owner),
    )
    .await;
    // The fence counter exists (on the source), as it does for any key used before.
    let seeded = reg.obtain("job").unwrap().try_lock().await.unwrap();
    seeded.release().await.unwrap();
    let slot = set.slot_of(JOB).unwrap();
    let from = set.master_of(slot).unwrap();
    let to = (0..3).find(|m| *m != from).unwrap();
    let m = blocking(|| set.begin_migration(slot, to)).unwrap();
    // The counter moves first: the free lock key and its fence are both on the target, where
    // the fence script follows the `SET`'s `ASK`; the owners hash is on neither node.
    blocking(|| set.move_keys(m, Some(&["{lock:job}:fence"]))).unwrap();
    let g = tokio::time::timeout(
        Duration::from_secs(2),
        reg.obtain("job").unwrap().try_lock(),
    )
    .await
    .expect("not held up by the migration")
    .unwrap();
    g.extend(lease).await.expect("extended while migrating");
    blocking(|| set.move_keys(m, None)).unwrap();
    g.extend(lease).await.expect("extended on the target");
    blocking(|| set.finish_migration(m)).unwrap();
    let info = reg.obtain("job").unwrap().inspect().await.unwrap().unwrap();
    assert_eq!(info.owners, ["migrating:1"]);
    g.release().await.unwrap();
}
