//! The scenarios of the lock kinds beyond the mutex: read-write locks, semaphores and
//! multi-key locks, and what every kind shares (one fence sequence per key, inspection and
//! listing). The cross-process ones are in `processes.rs`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{short_lease, within, Harness};
use distlock::Error;
use distlock::LockKind;
use distlock::{LockRegistry, RegistryOptions};

fn busy<T: std::fmt::Debug>(res: distlock::Result<T>, what: &str) {
    match res {
        Err(Error::NotAcquired { .. }) => {}
        other => panic!("{what}: expected NotAcquired, got {other:?}"),
    }
}

/// Readers of several registries hold a key together; a writer and the key's mutex are kept
/// out while they do; a writer keeps out readers, other writers and the mutex; and the mutex
/// keeps out both sides.
pub async fn readers_share_and_writers_exclude(h: &Harness) {
    let (a, b, c) = (h.registry().await, h.registry().await, h.registry().await);
    let ra = a.read_write("rw").unwrap();
    let rb = b.read_write("rw").unwrap();
    let rc = c.read_write("rw").unwrap();
    let r1 = ra.read().try_lock().await.expect("first reader");
    let r2 = rb.read().try_lock().await.expect("readers share the key");
    assert_eq!(r1.kind(), LockKind::Read);
    busy(rc.write().try_lock().await, "writer while two read");
    busy(
        c.obtain("rw").unwrap().try_lock().await,
        "mutex while two read",
    );
    r1.release().await.unwrap();
    busy(rc.write().try_lock().await, "writer while one reads");
    r2.release().await.unwrap();
    let w = rc
        .write()
        .try_lock()
        .await
        .expect("writer after the readers left");
    busy(ra.read().try_lock().await, "reader while a writer holds");
    busy(rb.write().try_lock().await, "second writer");
    busy(
        a.obtain("rw").unwrap().try_lock().await,
        "mutex while a writer holds",
    );
    w.release().await.unwrap();
    let m = crate::holds::take_free(&a, "rw", "mutex when free").await;
    busy(rb.read().try_lock().await, "reader while the mutex holds");
    busy(rc.write().try_lock().await, "writer while the mutex holds");
    m.release().await.unwrap();
    rb.read().try_lock().await.unwrap().release().await.unwrap();
}

/// Readers and writers of three registries work on shared state: a writer is never inside
/// with anybody else, and readers are inside together at times.
pub async fn read_write_exclusion_across_registries(h: &Harness) {
    let writer_in = Arc::new(AtomicBool::new(false));
    let readers_in = Arc::new(AtomicU32::new(0));
    let most_readers = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let reg = h.registry().await;
        for role in 0..3 {
            let rw = reg.read_write("shared").unwrap();
            let (writer_in, readers_in, most) =
                (writer_in.clone(), readers_in.clone(), most_readers.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..6 {
                    if role == 0 {
                        let g = rw.write().lock().await.unwrap();
                        assert!(!writer_in.swap(true, Ordering::SeqCst), "two writers");
                        assert_eq!(readers_in.load(Ordering::SeqCst), 0, "writer among readers");
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writer_in.store(false, Ordering::SeqCst);
                        g.release().await.unwrap();
                    } else {
                        let g = rw.read().lock().await.unwrap();
                        let n = readers_in.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        assert!(!writer_in.load(Ordering::SeqCst), "reader beside a writer");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        assert!(!writer_in.load(Ordering::SeqCst), "reader beside a writer");
                        readers_in.fetch_sub(1, Ordering::SeqCst);
                        g.release().await.unwrap();
                    }
                }
            }));
        }
    }
    within(Duration::from_secs(90), "readers and writers", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        most_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared the key"
    );
}

/// A writer that waits is served while a stream of overlapping readers (from registries of
/// their own, so that none can join another's hold) keeps the key read-locked.
pub async fn waiting_writer_is_not_starved_by_readers(h: &Harness) {
    let stop = Arc::new(AtomicBool::new(false));
    let writer_in = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..3u64 {
        let reg = h.registry().await;
        let (stop, writer_in) = (stop.clone(), writer_in.clone());
        readers.push(tokio::spawn(async move {
            let rw = reg.read_write("busy").unwrap();
            // Staggered, so that some reader always holds.
            tokio::time::sleep(Duration::from_millis(40 * i)).await;
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(g) = rw.read().try_lock_for(Duration::from_millis(200)).await {
                    assert!(
                        !writer_in.load(Ordering::SeqCst),
                        "reader beside the writer"
                    );
                    tokio::time::sleep(Duration::from_millis(120)).await;
                    assert!(
                        !writer_in.load(Ordering::SeqCst),
                        "reader beside the writer"
                    );
                    let _ = g.release().await;
                    reads += 1;
                }
            }
            reads
        }));
    }
    // Let the stream get going, then wait for the key as a writer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = h.registry().await;
    let limit = h.limit(Duration::from_secs(10), 40).await;
    let started = Instant::now();
    let g = writer
        .read_write("busy")
        .unwrap()
        .write()
        .try_lock_for(limit)
        .await
        .unwrap_or_else(|e| panic!("writer starved by readers for {:?}: {e}", started.elapsed()));
    writer_in.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    writer_in.store(false, Ordering::SeqCst);
    g.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let mut reads = 0;
    for r in readers {
        reads += within(Duration::from_secs(30), "readers stop", r)
            .await
            .unwrap();
    }
    assert!(reads >= 3, "the readers hardly read ({reads} reads)");
}

/// Readers of one registry share one remote hold (no round trip for those who join), each
/// with a fence larger than the last; a reader that comes after they all left starts anew.
pub async fn local_readers_share_one_remote_hold(h: &Harness) {
    let reg = h.registry().await;
    let rw = reg.read_write("local").unwrap();
    let first = rw.read().lock().await.unwrap();
    let second = rw
        .read()
        .try_lock()
        .await
        .expect("a second local reader joins");
    assert_eq!(
        first.token(),
        second.token(),
        "local readers share one remote hold"
    );
    if h.capabilities().await.fences() {
        assert!(second.fence() > first.fence());
    }
    let other = h.registry().await;
    busy(
        other.read_write("local").unwrap().write().try_lock().await,
        "writer while local readers hold",
    );
    first.release().await.unwrap();
    busy(
        other.read_write("local").unwrap().write().try_lock().await,
        "writer while one local reader holds",
    );
    second.release().await.unwrap();
    let w = other
        .read_write("local")
        .unwrap()
        .write()
        .try_lock_for(Duration::from_secs(2))
        .await
        .expect("the last local reader released the shared hold");
    w.release().await.unwrap();
}

/// A reader that stops renewing (crashed) frees its share after its lease, even while another
/// reader renews its own: a writer gets the key as soon as the live reader leaves.
pub async fn crashed_reader_frees_its_share(h: &Harness) {
    let lease = Duration::from_millis(600);
    let crashed = h.unrenewed_registry(lease).await;
    let live = h.registry_with(short_lease()).await;
    let g = crate::holds::read(&crashed, "r").await;
    std::mem::forget(g); // no release: the process died
    let l = live.read_write("r").unwrap().read().lock().await.unwrap();
    // Past the crashed reader's lease while the live reader renews (several renewals).
    tokio::time::sleep(lease * 3).await;
    assert!(l.is_held());
    let writer = h.registry().await;
    let w = writer.read_write("r").unwrap();
    busy(
        w.write().try_lock().await,
        "writer while the live reader holds",
    );
    l.release().await.unwrap();
    let limit = h.limit(Duration::from_millis(500), 10).await;
    let g = w
        .write()
        .try_lock_for(limit)
        .await
        .expect("the crashed reader's share outlived its lease");
    g.release().await.unwrap();
}

/// At most `permits` tasks of three registries are inside at once, and more than one is at
/// times.
pub async fn semaphore_admits_at_most_its_permits(h: &Harness) {
    let permits = 3;
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let reg = h.registry().await;
        for _ in 0..3 {
            let sem = reg.semaphore("pool", permits).unwrap();
            let (inside, most) = (inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let g = sem.lock().await.unwrap();
                    assert_eq!(g.kind(), LockKind::Semaphore { permits });
                    let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(n <= permits, "{n} holders of {permits} permits");
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    within(Duration::from_secs(90), "semaphore holders", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(most.load(Ordering::SeqCst) >= 2, "permits never overlapped");
}

/// `try_lock` fails fast when every permit is taken, `try_lock_for` waits about as long as
/// asked, a waiter gets a permit once one is given back, and a permit is its own hold (own
/// token and fence).
pub async fn semaphore_try_timed_and_blocking(h: &Harness) {
    let (a, b) = (h.registry().await, h.registry().await);
    let sa = a.semaphore("sem", 2).unwrap();
    let sb = b.semaphore("sem", 2).unwrap();
    let p1 = sa.lock().await.unwrap();
    let p2 = sb.lock().await.unwrap();
    assert_ne!(p1.token(), p2.token(), "each permit has its own token");
    if h.capabilities().await.fences() {
        assert!(p2.fence() > p1.fence());
    }
    busy(sb.try_lock().await, "third permit");
    let limit = h.limit(Duration::from_millis(1500), 10).await;
    let started = Instant::now();
    busy(sa.try_lock_for(Duration::from_millis(300)).await, "timed");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < limit,
        "waited {waited:?}"
    );
    let waiter = tokio::spawn(async move { sb.lock().await.map(|g| (Instant::now(), g)) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "a waiter got a permit none gave back"
    );
    let released = Instant::now();
    p1.release().await.unwrap();
    let (at, p3) = within(Duration::from_secs(10), "waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let limit = h.limit(Duration::from_millis(600), 10).await;
    assert!(at - released < limit, "waiter took {:?}", at - released);
    p2.release().await.unwrap();
    p3.release().await.unwrap();
}

/// Holders that disagree on the number of permits get a clear error while the backend can
/// see the others, and a semaphore excludes the other kinds of its key.
pub async fn semaphore_holders_must_agree_on_permits(h: &Harness) {
    let (a, b) = (h.registry().await, h.registry().await);
    let p = a.semaphore("n", 2).unwrap().lock().await.unwrap();
    match b.semaphore("n", 3).unwrap().try_lock().await {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains("permit"), "{msg}"),
        other => panic!("a holder with other permits got {other:?}"),
    }
    busy(
        b.obtain("n").unwrap().try_lock().await,
        "mutex beside a permit",
    );
    if b.backend().capabilities().read_write {
        busy(
            b.read_write("n").unwrap().read().try_lock().await,
            "reader beside a permit",
        );
    }
    let q = b
        .semaphore("n", 2)
        .unwrap()
        .try_lock()
        .await
        .expect("same permits");
    p.release().await.unwrap();
    q.release().await.unwrap();
    assert!(matches!(a.semaphore("n", 0), Err(Error::InvalidConfig(_))));
    assert!(matches!(
        a.semaphore("n", distlock::MAX_PERMITS + 1),
        Err(Error::InvalidConfig(_))
    ));
    // The error names a long key by its start and length, not whole.
    let long = "n".repeat(500);
    let held = a.semaphore(&long, 2).unwrap().lock().await.unwrap();
    match b.semaphore(&long, 3).unwrap().try_lock().await {
        Err(Error::InvalidConfig(msg)) => {
            assert!(msg.len() < 300, "{} bytes: {msg}", msg.len());
            assert!(msg.contains("permits"), "{msg}");
        }
        other => panic!("a holder with other permits got {other:?}"),
    }
    held.release().await.unwrap();
}

/// A permit holder that stops renewing (crashed) gives its permit back after its lease.
pub async fn crashed_permit_holder_frees_its_permit(h: &Harness) {
    let lease = Duration::from_millis(600);
    let crashed = h.unrenewed_registry(lease).await;
    let started = Instant::now();
    std::mem::forget(crashed.semaphore("s", 1).unwrap().lock().await.unwrap());
    let other = h.registry().await;
    let sem = other.semaphore("s", 1).unwrap();
    busy(sem.try_lock().await, "the only permit");
    let limit = h.limit(Duration::from_secs(3), 10).await;
    let g = sem
        .try_lock_for(limit)
        .await
        .expect("the crashed holder's permit came back");
    assert!(
        started.elapsed() >= lease - Duration::from_millis(100),
        "taken before the lease ended"
    );
    g.release().await.unwrap();
}

/// Read holds and permits are renewed past their lease, and report their loss when their key
/// is deleted underneath them.
pub async fn shared_holds_renew_and_report_loss(h: &Harness) {
    let caps = h.backend().await.capabilities();
    let lease = Duration::from_secs(1).max(h.cycle_time().await * 30);
    let reg = h
        .registry_with(RegistryOptions::default().with_lease(lease))
        .await;
    let mut guards = Vec::new();
    if caps.read_write {
        guards.push(reg.read_write("r").unwrap().read().lock().await.unwrap());
    }
    if caps.semaphores {
        guards.push(reg.semaphore("s", 2).unwrap().lock().await.unwrap());
    }
    tokio::time::sleep(lease * 2).await;
    for g in &guards {
        assert!(g.is_held(), "{:?} lost despite renewal", g.kind());
    }
    let limit = h.limit(lease * 2, 10).await;
    for g in guards {
        let key = g.key().to_owned();
        assert!(h.delete(&key).await, "no deleter");
        within(limit, "lost signal", g.lost()).await;
        assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    }
}

/// Dropping a waiting writer's, reader's or permit taker's future leaves nothing behind: the
/// writer no longer keeps readers out, and nothing stays held.
pub async fn cancelled_kind_acquisitions_leave_nothing_behind(h: &Harness) {
    let caps = h.backend().await.capabilities();
    let (a, b, c) = (h.registry().await, h.registry().await, h.registry().await);
    let limit = h.limit(Duration::from_secs(1), 10).await;
    if caps.read_write {
        let r = a.read_write("c").unwrap().read().lock().await.unwrap();
        let w = b.read_write("c").unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), w.write().lock())
                .await
                .is_err()
        );
        // The cancelled writer must not keep new readers out.
        let r2 = within(limit, "reader after a cancelled writer", async {
            c.read_write("c").unwrap().read().try_lock_for(limit).await
        })
        .await
        .expect("a cancelled writer kept readers out");
        r.release().await.unwrap();
        r2.release().await.unwrap();
        let w = within(limit, "writer after", w.write().try_lock_for(limit))
            .await
            .expect("write after all left");
        assert!(tokio::time::timeout(
            Duration::from_millis(200),
            c.read_write("c").unwrap().read().lock()
        )
        .await
        .is_err());
        w.release().await.unwrap();
        within(limit, "write after a cancelled reader", async {
            a.read_write("c").unwrap().write().try_lock_for(limit).await
        })
        .await
        .expect("a cancelled reader kept the key")
        .release()
        .await
        .unwrap();
    }
    if caps.semaphores {
        let p = a.semaphore("s", 1).unwrap().lock().await.unwrap();
        for i in 0..20u64 {
            let sem = b.semaphore("s", 1).unwrap();
            let _ = tokio::time::timeout(Duration::from_micros(200 * i), sem.lock()).await;
        }
        p.release().await.unwrap();
        within(limit, "permit after cancelled takers", async {
            c.semaphore("s", 1).unwrap().try_lock_for(limit).await
        })
        .await
        .expect("a cancelled permit taker kept a permit")
        .release()
        .await
        .unwrap();
    }
}

/// One fence sequence per key across every kind: a mutex, readers, a writer and permits of
/// the same key, one after another, get ever larger fences.
pub async fn fences_increase_across_kinds(h: &Harness) {
    let caps = h.backend().await.capabilities();
    let regs = [h.registry().await, h.registry().await];
    let mut last = 0;
    let mut check = |fence: u64, what: &str| {
        assert!(fence > last, "{what}: fence {fence} after {last}");
        last = fence;
    };
    for round in 0..2 {
        let reg = &regs[round % 2];
        let g = reg.obtain("f").unwrap().lock().await.unwrap();
        check(g.fence(), "mutex");
        g.release().await.unwrap();
        if caps.read_write {
            let rw = reg.read_write("f").unwrap();
            let r1 = rw.read().lock().await.unwrap();
            check(r1.fence(), "reader");
            let r2 = regs[(round + 1) % 2]
                .read_write("f")
                .unwrap()
                .read()
                .lock()
                .await
                .unwrap();
            check(r2.fence(), "second reader");
            r1.release().await.unwrap();
            r2.release().await.unwrap();
            let w = rw.write().lock().await.unwrap();
            check(w.fence(), "writer");
            w.release().await.unwrap();
        }
        if caps.semaphores {
            let p = reg.semaphore("f", 2).unwrap().lock().await.unwrap();
            check(p.fence(), "permit");
            p.release().await.unwrap();
        }
    }
}

/// A multi-key lock is all or nothing: it fails while one key is busy and leaves the others
/// free; once held, every key is held, and it is lost as soon as one of them is.
pub async fn multi_key_lock_is_all_or_nothing(h: &Harness) {
    let (a, b) = (h.registry().await, h.registry_with(short_lease()).await);
    let held = a.obtain("m2").unwrap().lock().await.unwrap();
    let multi = b.multi(&["m3", "m1", "m2"]).unwrap();
    let keys: Vec<&str> = multi.locks().iter().map(|l| l.key()).collect();
    assert_eq!(keys, ["m1", "m2", "m3"], "taken in key order");
    busy(multi.try_lock().await, "multi-key lock with one key busy");
    busy(
        multi.try_lock_for(Duration::from_millis(200)).await,
        "timed multi-key lock",
    );
    for k in ["m1", "m3"] {
        a.obtain(k)
            .unwrap()
            .try_lock()
            .await
            .unwrap_or_else(|e| panic!("{k} kept by a failed multi-key lock: {e}"))
            .release()
            .await
            .unwrap();
    }
    held.release().await.unwrap();
    // Not `try_lock`: the timed attempt above may have left an attempt on `m2` running when
    // its deadline came (it finishes in the background and is then undone), and on a slow
    // server that one can take `m2` after the release, for a moment.
    let free_within = h.limit(Duration::from_secs(2), 10).await;
    let g = multi.try_lock_for(free_within).await.expect("all free");
    for k in ["m1", "m2", "m3"] {
        busy(
            a.obtain(k).unwrap().try_lock().await,
            "a key of a held multi-key lock",
        );
        assert!(g.fence(k).is_some());
    }
    assert!(matches!(b.multi(&["x", "x"]), Err(Error::InvalidKey(_))));
    let long = "x".repeat(500);
    match b.multi(&[&long, &long]) {
        Err(Error::InvalidKey(msg)) => assert!(msg.len() < 300, "{msg}"),
        other => panic!("a key twice gave {other:?}"),
    }
    assert!(matches!(b.multi::<&str>(&[]), Err(Error::InvalidConfig(_))));
    let limit = h.limit(Duration::from_secs(2), 10).await;
    assert!(h.delete("m3").await, "no deleter");
    within(limit, "multi-key lost signal", g.lost()).await;
    assert!(!g.is_held());
    assert!(matches!(g.release().await, Err(Error::LockLost { .. })));
    a.obtain("m1")
        .unwrap()
        .try_lock()
        .await
        .expect("released")
        .release()
        .await
        .unwrap();
}

/// Multi-key holders whose keys overlap, asking in opposite orders, never deadlock.
pub async fn multi_key_locks_do_not_deadlock(h: &Harness) {
    let mut tasks = Vec::new();
    for i in 0..4 {
        let reg = h.registry().await;
        tasks.push(tokio::spawn(async move {
            let keys: &[&str] = if i % 2 == 0 {
                &["d1", "d2", "d3"]
            } else {
                &["d3", "d2", "d1"]
            };
            let multi = reg.multi(keys).unwrap();
            for _ in 0..5 {
                let g = multi.lock().await.unwrap();
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
        }));
    }
    within(
        Duration::from_secs(60),
        "overlapping multi-key holders",
        async {
            for t in tasks {
                t.await.unwrap();
            }
        },
    )
    .await;
}

/// `inspect` and `list` see every kind: a mutex, two readers and a permit, with their kind and,
/// where the backend can tell, the number of holders; keys of another prefix stay out.
pub async fn inspect_and_list_show_every_kind(h: &Harness) {
    let caps = h.backend().await.capabilities();
    let (a, b) = (h.registry().await, h.registry().await);
    let mut guards = vec![a.obtain("l-mutex").unwrap().lock().await.unwrap()];
    if caps.read_write {
        guards.push(a.read_write("l-read").unwrap().read().lock().await.unwrap());
        guards.push(b.read_write("l-read").unwrap().read().lock().await.unwrap());
    }
    if caps.semaphores {
        guards.push(a.semaphore("l-sem", 3).unwrap().lock().await.unwrap());
    }
    let elsewhere = LockRegistry::from_backend(
        h.backend().await,
        RegistryOptions::default().with_prefix(format!("{}x", h.prefix())),
    )
    .unwrap();
    let foreign = elsewhere.obtain("l-mutex").unwrap().lock().await.unwrap();
    let expect = |key: &str| -> (LockKind, u32) {
        match key {
            "l-mutex" => (LockKind::Mutex, 1),
            "l-read" => (LockKind::Read, 2),
            _ => (LockKind::Semaphore { permits: 3 }, 1),
        }
    };
    let check = |key: &str, info: &distlock::LockInfo| {
        let (kind, holders) = expect(key);
        if let Some(k) = info.kind {
            match (k, kind) {
                (LockKind::Semaphore { permits }, LockKind::Semaphore { .. }) => {
                    assert!(permits == 3 || permits == 0, "{key}: {k}")
                }
                _ => assert_eq!(k, kind, "{key}"),
            }
        }
        if let Some(n) = info.holders {
            assert_eq!(n, holders, "{key}: holders");
        }
        assert!(info.remaining.is_none_or(|r| r > Duration::ZERO), "{key}");
    };
    for g in &guards {
        let info = a
            .obtain(g.key())
            .unwrap()
            .inspect()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} not visible", g.key()));
        check(g.key(), &info);
    }
    let listed = a.backend().list(h.prefix()).await.expect("list");
    let mut keys: Vec<&str> = listed.iter().map(|l| l.key.as_str()).collect();
    keys.sort_unstable();
    let mut want: Vec<&str> = guards.iter().map(|g| g.key()).collect();
    want.sort_unstable();
    want.dedup();
    assert_eq!(keys, want, "listed keys");
    for l in &listed {
        check(&l.key, &l.info);
    }
    for g in guards {
        g.release().await.unwrap();
    }
    foreign.release().await.unwrap();
    let listed = a.backend().list(h.prefix()).await.expect("list");
    assert!(listed.is_empty(), "released locks still listed: {listed:?}");
}

/// The blocking facade covers every kind: readers on several threads at once, a writer
/// waiting for them, a permit per thread, and a multi-key lock.
pub async fn blocking_facade_covers_every_kind(h: &Harness) {
    let backend = h.backend().await;
    let caps = backend.capabilities();
    let prefix = h.prefix().to_owned();
    tokio::task::spawn_blocking(move || {
        let reg = super::blocking_registry(backend, prefix);
        if caps.read_write {
            let rw = reg.read_write("b").unwrap();
            rw.read().lock().unwrap();
            rw.read().lock().unwrap(); // reentrant per thread
            let other = rw.clone();
            let t = std::thread::spawn(move || {
                let shared = other.read().try_lock_for(Duration::from_secs(2)).unwrap();
                let excluded = !other
                    .write()
                    .try_lock_for(Duration::from_millis(100))
                    .unwrap();
                other.read().unlock().unwrap();
                shared && excluded
            });
            assert!(
                t.join().unwrap(),
                "a second thread could not share the read lock"
            );
            rw.read().unlock().unwrap();
            rw.read().unlock().unwrap();
            assert!(rw.write().try_lock_for(Duration::from_secs(2)).unwrap());
            rw.write().unlock().unwrap();
        }
        if caps.semaphores {
            let sem = reg.semaphore("bs", 2).unwrap();
            assert!(sem.try_lock().unwrap());
            let other = sem.clone();
            let t = std::thread::spawn(move || {
                let ok = other.try_lock().unwrap();
                other.unlock().unwrap();
                ok
            });
            assert!(t.join().unwrap(), "a second thread got no permit of two");
            sem.unlock().unwrap();
        }
        let multi = reg.multi(&["bm1", "bm2"]).unwrap();
        let g = multi.lock().unwrap();
        assert!(g.is_held());
        assert!(!reg.obtain("bm2").unwrap().try_lock().unwrap());
        g.unlock().unwrap();
        assert!(reg.obtain("bm2").unwrap().try_lock().unwrap());
        reg.obtain("bm2").unwrap().unlock().unwrap();
    })
    .await
    .unwrap();
}
