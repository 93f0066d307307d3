//! Interop with real Curator (Debian's Curator 5.4 on the JDK): its mutex, read-write lock and
//! semaphore and ours on the same paths.

use super::*;

/// Real Curator's `InterProcessMutex` (Debian's Curator 5.4 on the JDK) and distlock's mutex
/// exclude each other on the same path, both ways: we queue behind Curator's node, see its
/// czxid as the fence, get the lock when it lets go, and keep Curator out while we hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_interprocess_mutex_and_ours_exclude_each_other() {
    let server = shared();
    let r = root();
    let b = backend(&format!("{}{r}", server.url())).await;
    let reg = registry(&b, RegistryOptions::default());
    let path = format!("{r}/job");
    let cs = server.connect_string();
    let mut curator = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
    assert!(curator.outcome().await, "Curator's mutex on a free path");
    let lock = reg.obtain("job").unwrap();
    busy(lock.try_lock().await, "our mutex while Curator's holds");
    let client = b.client().await.unwrap();
    let nodes = client.list_children(&path).await.unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(is_curator_name(&nodes[0]), "{nodes:?}");
    let (_, stat) = client
        .get_data(&format!("{path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(
        lock.inspect().await.unwrap().unwrap().fence,
        Some(stat.czxid as u64)
    );
    // Queued behind it; it lets go; we get it.
    let waiter = tokio::spawn(async move { lock.lock().await });
    until(&client, &path, |c| c.len() == 2, "our node queued").await;
    assert!(!waiter.is_finished());
    curator.release().await;
    let g = timeout(JVM_LIMIT, waiter)
        .await
        .expect("woken by Curator's release")
        .unwrap()
        .unwrap();
    assert!(g.fence() > (stat.czxid as u64) << 10);
    let mut other = Curator::start(&cs, "mutex", &path, Duration::from_millis(500)).await;
    assert!(!other.outcome().await, "Curator's mutex while ours holds");
    g.release().await.unwrap();
}

/// Curator's readers and ours share a key; a writer of either side is kept out while they
/// read, and so is our mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_readers_and_ours_share_the_key() {
    let server = shared();
    let r = root();
    let url = format!("{}{r}", server.url());
    let (a, b) = (backend(&url).await, backend(&url).await);
    let (areg, breg) = (
        registry(&a, RegistryOptions::default()),
        registry(&b, RegistryOptions::default()),
    );
    let path = format!("{r}/doc");
    let cs = server.connect_string();
    let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
    assert!(reader.outcome().await, "Curator's reader on a free path");
    let ours = areg
        .read_write("doc")
        .unwrap()
        .read()
        .try_lock()
        .await
        .expect("our reader beside Curator's");
    busy(
        breg.read_write("doc").unwrap().write().try_lock().await,
        "our writer while Curator and we read",
    );
    busy(
        breg.obtain("doc").unwrap().try_lock().await,
        "our mutex while Curator and we read",
    );
    let mut writer = Curator::start(&cs, "write", &path, Duration::from_millis(500)).await;
    assert!(!writer.outcome().await, "Curator's writer while we read");
    let info = breg
        .obtain("doc")
        .unwrap()
        .inspect()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.kind, info.holders),
        (Some(distlock::LockKind::Read), Some(2))
    );
    reader.release().await;
    // And the other way round: Curator's reader joins ours.
    let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
    assert!(reader.outcome().await, "Curator's reader beside ours");
    ours.release().await.unwrap();
    reader.release().await;
}

/// A writer of either side keeps out every reader and writer of the other (and our mutex),
/// and a writer that waits keeps new readers of the other side out (writer preference
/// comes from the order of the nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_writer_and_ours_exclude_every_other_holder() {
    let server = shared();
    let r = root();
    let url = format!("{}{r}", server.url());
    let (a, b) = (backend(&url).await, backend(&url).await);
    let (areg, breg) = (
        registry(&a, RegistryOptions::default()),
        registry(&b, RegistryOptions::default()),
    );
    let client = a.client().await.unwrap();
    let path = format!("{r}/doc");
    let cs = server.connect_string();
    let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(30)).await;
    assert!(writer.outcome().await);
    let rw = areg.read_write("doc").unwrap();
    busy(
        rw.read().try_lock().await,
        "our reader beside Curator's writer",
    );
    busy(
        rw.write().try_lock().await,
        "our writer beside Curator's writer",
    );
    busy(
        areg.obtain("doc").unwrap().try_lock().await,
        "our mutex beside Curator's writer",
    );
    // Our reader waits for it and gets in when it leaves.
    let waiter = tokio::spawn({
        let rw = rw.clone();
        async move { rw.read().lock().await }
    });
    until(&client, &path, |c| c.len() == 2, "our reader queued").await;
    writer.release().await;
    let ours = timeout(JVM_LIMIT, waiter)
        .await
        .expect("our reader woken by Curator's writer leaving")
        .unwrap()
        .unwrap();
    // Curator's writer waits for our reader, and keeps our new readers out meanwhile.
    let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(60)).await;
    until(&client, &path, has(WRITE), "Curator's writer queued").await;
    assert!(writer.waiting(), "Curator's writer beside our reader");
    busy(
        breg.read_write("doc").unwrap().read().try_lock().await,
        "our new reader behind Curator's waiting writer",
    );
    ours.release().await.unwrap();
    assert!(
        writer.outcome().await,
        "Curator's writer after our reader left"
    );
    writer.release().await;

    // Our writer keeps out Curator's readers and writers ...
    let w = rw
        .write()
        .try_lock()
        .await
        .expect("our writer on a free key");
    let mut reader = Curator::start(&cs, "read", &path, Duration::from_millis(500)).await;
    assert!(
        !reader.outcome().await,
        "Curator's reader beside our writer"
    );
    let mut writer = Curator::start(&cs, "write", &path, Duration::from_millis(500)).await;
    assert!(!writer.outcome().await, "Curator's writer beside ours");
    // ... and a Curator reader that waits gets in once it leaves.
    let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(60)).await;
    until(&client, &path, has(READ), "Curator's reader queued").await;
    assert!(reader.waiting(), "Curator's reader beside our writer");
    // Our new readers queue behind our writer too (nothing jumps the queue).
    busy(
        breg.read_write("doc").unwrap().read().try_lock().await,
        "our reader beside our writer",
    );
    w.release().await.unwrap();
    assert!(
        reader.outcome().await,
        "Curator's reader after our writer left"
    );
    reader.release().await;
}

/// Curator's `InterProcessMutex` and `InterProcessReadWriteLock` on one path ignore each
/// other (Curator's behaviour: each sorts the other's names after its own); distlock's
/// kinds see both: our readers and writers wait for Curator's mutex, our mutex waits for
/// Curator's readers and writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_mutex_and_read_write_lock_ignore_each_other_but_ours_see_both() {
    let server = shared();
    let r = root();
    let b = backend(&format!("{}{r}", server.url())).await;
    let reg = registry(&b, RegistryOptions::default());
    let path = format!("{r}/mixed");
    let cs = server.connect_string();
    let mut mutex = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
    assert!(mutex.outcome().await);
    let rw = reg.read_write("mixed").unwrap();
    busy(
        rw.read().try_lock().await,
        "our reader beside Curator's mutex",
    );
    busy(
        rw.write().try_lock().await,
        "our writer beside Curator's mutex",
    );
    // Curator's own reader does not see Curator's mutex.
    let mut reader = Curator::start(&cs, "read", &path, Duration::from_secs(30)).await;
    assert!(
        reader.outcome().await,
        "Curator's reader beside Curator's mutex (Curator's own behaviour)"
    );
    mutex.release().await;
    busy(
        reg.obtain("mixed").unwrap().try_lock().await,
        "our mutex beside Curator's reader",
    );
    reader.release().await;
    let mut writer = Curator::start(&cs, "write", &path, Duration::from_secs(30)).await;
    assert!(writer.outcome().await);
    busy(
        reg.obtain("mixed").unwrap().try_lock().await,
        "our mutex beside Curator's writer",
    );
    writer.release().await;
    reg.obtain("mixed")
        .unwrap()
        .try_lock()
        .await
        .expect("free again")
        .release()
        .await
        .unwrap();
}

/// Curator's `InterProcessSemaphoreV2` and ours share the count: together they never hold
/// more than its permits, a distlock waiter that holds Curator's `locks` mutex while it
/// waits lets a Curator taker queue behind it (no deadlock), and permits go round between
/// both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curators_permits_and_ours_never_exceed_the_count() {
    let server = shared();
    let r = root();
    let url = format!("{}{r}", server.url());
    let (a, b) = (backend(&url).await, backend(&url).await);
    let (areg, breg) = (
        registry(&a, RegistryOptions::default()),
        registry(&b, RegistryOptions::default()),
    );
    let client = a.client().await.unwrap();
    let path = format!("{r}/pool");
    let leases = format!("{path}/leases");
    let locks = format!("{path}/locks");
    let cs = server.connect_string();
    let mut c1 = Curator::start(&cs, "sem:2", &path, Duration::from_secs(30)).await;
    assert!(c1.outcome().await);
    let p1 = areg
        .semaphore("pool", 2)
        .unwrap()
        .try_lock()
        .await
        .expect("our permit beside Curator's");
    busy(
        breg.semaphore("pool", 2).unwrap().try_lock().await,
        "a third permit (ours)",
    );
    let mut c2 = Curator::start(&cs, "sem:2", &path, Duration::from_millis(500)).await;
    assert!(!c2.outcome().await, "a third permit (Curator's)");
    assert_eq!(client.list_children(&leases).await.unwrap().len(), 2);
    let info = areg
        .obtain("pool")
        .unwrap()
        .inspect()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.holders, Some(2));

    // Our waiter takes Curator's `locks` mutex and waits with its lease; a Curator taker
    // queues behind it on that mutex.
    let waiter = tokio::spawn({
        let sem = breg.semaphore("pool", 2).unwrap();
        async move { sem.lock().await }
    });
    until(&client, &leases, |c| c.len() == 3, "our waiting lease").await;
    let mut c3 = Curator::start(&cs, "sem:2", &path, Duration::from_secs(60)).await;
    until(&client, &locks, |c| c.len() == 2, "Curator queued on locks").await;
    c1.release().await;
    let p2 = timeout(JVM_LIMIT, waiter)
        .await
        .expect("our waiter gets the permit Curator gave back")
        .unwrap()
        .unwrap();
    // Curator's taker now waits with its lease for one of the two permits we hold.
    until(
        &client,
        &leases,
        |c| c.len() == 3,
        "Curator's waiting lease",
    )
    .await;
    assert!(c3.waiting(), "a third permit for Curator");
    p1.release().await.unwrap();
    assert!(
        c3.outcome().await,
        "Curator's taker after our permit came back"
    );
    busy(
        areg.semaphore("pool", 2).unwrap().try_lock().await,
        "a third permit beside ours and Curator's",
    );
    assert_eq!(client.list_children(&leases).await.unwrap().len(), 2);
    p2.release().await.unwrap();
    c3.release().await;
    // A distlock taker with another count is refused beside our holder (Curator records
    // no count, so beside Curator's holders only the number of leases decides).
    let p = areg.semaphore("pool", 2).unwrap().try_lock().await.unwrap();
    match breg.semaphore("pool", 3).unwrap().try_lock().await {
        Err(Error::InvalidConfig(msg)) => assert!(msg.contains("permit"), "{msg}"),
        other => panic!("a taker with another count got {other:?}"),
    }
    p.release().await.unwrap();
}

/// Holders' descriptions are in their nodes' data: Curator's mutex and permit holders show
/// what Curator writes there (its client's address), a node with no data (an older distlock's)
/// shows as unknown, and ours show our description beside Curator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_of_curator_older_and_our_holders() {
    let server = shared();
    let r = root();
    let b = backend(&format!("{}{r}", server.url())).await;
    let owner = distlock::Owner::new("billing:7").unwrap();
    let reg = registry(&b, RegistryOptions::default().with_owner(owner));
    let client = b.client().await.unwrap();
    let cs = server.connect_string();
    let owners = |key: &'static str| {
        let reg = reg.clone();
        async move {
            let info = reg.obtain(key).unwrap().inspect().await.unwrap();
            info.map(|i| i.owners).unwrap_or_default()
        }
    };

    let path = format!("{r}/job");
    let mut curator = Curator::start(&cs, "mutex", &path, Duration::from_secs(30)).await;
    assert!(curator.outcome().await, "Curator's mutex on a free path");
    let nodes = client.list_children(&path).await.unwrap();
    let (data, _) = client
        .get_data(&format!("{path}/{}", nodes[0]))
        .await
        .unwrap();
    assert!(!data.is_empty(), "Curator writes its client's address");
    assert_eq!(owners("job").await, [distlock::Owner::shown(&data)]);
    curator.release().await;

    // Ours: the description is the node's data.
    let g = reg.obtain("job").unwrap().lock().await.unwrap();
    let nodes = client.list_children(&path).await.unwrap();
    let (data, _) = client
        .get_data(&format!("{path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(data, b"billing:7");
    assert_eq!(owners("job").await, ["billing:7"]);
    g.release().await.unwrap();

    // A holder node with no data, as older distlock versions made.
    let old = format!("{r}/older");
    let opts =
        zookeeper_client::CreateMode::Container.with_acls(zookeeper_client::Acls::anyone_all());
    client.create(&old, &[], &opts).await.unwrap();
    let node = zookeeper_client::CreateMode::EphemeralSequential
        .with_acls(zookeeper_client::Acls::anyone_all());
    let name = format!("{old}/_c_{}-lock-", "0a0b0c0d-0000-0000-0000-000000000001");
    client.create(&name, &[], &node).await.unwrap();
    assert_eq!(owners("older").await, [distlock::UNKNOWN_OWNER]);

    // Permits: Curator's beside ours, one description each.
    let sem = format!("{r}/pool");
    let mut c = Curator::start(&cs, "sem:3", &sem, Duration::from_secs(30)).await;
    assert!(c.outcome().await, "Curator's permit");
    let p = reg.semaphore("pool", 3).unwrap().lock().await.unwrap();
    let leases = client
        .list_children(&format!("{sem}/leases"))
        .await
        .unwrap();
    let mut datas = Vec::new();
    for l in &leases {
        let (d, _) = client.get_data(&format!("{sem}/leases/{l}")).await.unwrap();
        datas.push(d);
    }
    let curators = datas
        .iter()
        .find(|d| !d.starts_with(b"permits="))
        .expect("Curator's lease");
    let mut want = vec!["billing:7".to_owned(), distlock::Owner::shown(curators)];
    want.sort();
    assert_eq!(owners("pool").await, want);
    p.release().await.unwrap();
    c.release().await;
}
