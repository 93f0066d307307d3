//! The pool's line of waiting requests against a real server: batching, requests given up
//! in line or mid-exchange, and connections from before a `clear`.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use distlock_testkit::redis::RedisServer;

fn pool(server: &RedisServer) -> Arc<Pool> {
    Arc::new(Pool::new(ConnInfo {
        addr: format!("127.0.0.1:{}", server.port()),
        user: None,
        password: None,
        db: 0,
        connect_timeout: Duration::from_secs(5),
        response_timeout: Duration::from_secs(30),
        sentinel: None,
        node_id: None,
        tls: None,
    }))
}

fn busy(pool: &Pool) -> (usize, usize) {
    let line = pool.line.lock().unwrap();
    (line.busy, line.waiting.len())
}

/// The number `name` of an `INFO` reply.
fn info_stat(info: &str, name: &str) -> usize {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in INFO"))
}

/// Holds every connection of `pool` for about `secs` (a `BLPOP` on a list nobody
/// fills), and returns once they are all in use.
async fn occupy(pool: &Arc<Pool>, secs: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let tasks: Vec<_> = (0..MAX_OPEN)
        .map(|_| {
            let (p, secs) = (pool.clone(), secs.to_owned());
            tokio::spawn(async move {
                let cmd: [&[u8]; 3] = [b"BLPOP", b"nothing", secs.as_bytes()];
                p.pipeline(&[cmd]).await.unwrap();
            })
        })
        .collect();
    while busy(pool).0 < MAX_OPEN {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tasks
}

/// Thousands of concurrent requests: each gets its own replies, in order, no more
/// than `MAX_OPEN` connections are opened for them, and the server reads them in
/// batches (far fewer reads than requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_get_their_own_replies_over_few_connections() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let pool = pool(&server);
    let tasks: Vec<_> = (0..5000)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let (key, value) = (format!("k{i}"), format!("v{i}"));
                let set: [&[u8]; 3] = [b"SET", key.as_bytes(), value.as_bytes()];
                let get: [&[u8]; 2] = [b"GET", key.as_bytes()];
                let replies = pool.pipeline(&[&set[..], &get[..]]).await.unwrap();
                assert_eq!(
                    replies,
                    vec![
                        Reply::Simple("OK".into()),
                        Reply::Bulk(Some(value.into_bytes()))
                    ]
                );
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let info = server.cli(&["INFO"]).unwrap();
    let stat = |name: &str| info_stat(&info, name);
    // The pool's connections and `redis-cli`'s own.
    let connected = stat("connected_clients");
    assert!(connected <= MAX_OPEN + 1, "{connected} connections");
    let reads = stat("total_reads_processed");
    assert!(reads < 2500, "{reads} reads for 5000 requests");
    assert_eq!(busy(&pool), (0, 0));
}

/// With `max_open` set, hundreds of concurrent requests never have more than that many
/// connections in use, and the server never sees more opened: the rest wait in line and go
/// out batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_bounded_below_the_default_opens_no_more_connections_than_its_bound() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let pool = Arc::new(
        Arc::into_inner(pool(&server))
            .expect("one owner")
            .with_max_open(3),
    );
    // Counts from here: the connections of the server's start-up checks are not the pool's.
    server.cli(&["CONFIG", "RESETSTAT"]).unwrap();
    // The most connections in use at once, seen by a task that looks while they run.
    let watch = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut most = 0;
            for _ in 0..2000 {
                most = most.max(busy(&pool).0);
                tokio::task::yield_now().await;
            }
            most
        })
    };
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                let incr: [&[u8]; 2] = [b"INCR", key.as_bytes()];
                assert_eq!(pool.pipeline(&[incr]).await.unwrap(), vec![Reply::Int(1)]);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let most = watch.await.unwrap();
    assert!(most <= 3, "{most} connections in use at once");
    let info = server.cli(&["INFO"]).unwrap();
    let stat = |name: &str| info_stat(&info, name);
    // Every connection the server accepted since the reset: the pool's and `INFO`'s.
    let opened = stat("total_connections_received");
    assert!(opened <= 3 + 1, "{opened} connections opened");
    assert!(opened > 1, "the pool opened none");
    assert_eq!(busy(&pool), (0, 0));
    assert_eq!(pool.idle.lock().unwrap().len(), opened - 1);
}

/// A request whose caller gives up while it waits in line is never sent, and its
/// place is gone; the connections come back once their requests are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_given_up_in_line_are_never_sent() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let pool = pool(&server);
    let holders = occupy(&pool, "1").await;
    for _ in 0..10 {
        let incr: [&[u8]; 2] = [b"INCR", b"given-up"];
        let waited = tokio::time::timeout(Duration::from_millis(20), pool.pipeline(&[incr])).await;
        assert!(waited.is_err(), "every connection is in use");
    }
    assert_eq!(
        busy(&pool),
        (MAX_OPEN, 10),
        "the places stay until a batch looks"
    );
    for h in holders {
        h.await.unwrap();
    }
    let get: [&[u8]; 2] = [b"GET", b"given-up"];
    assert_eq!(
        pool.pipeline(&[get]).await.unwrap(),
        vec![Reply::Bulk(None)]
    );
    assert_eq!(busy(&pool), (0, 0));
}

/// A connection opened before a `clear` (a failover: it may reach the old master) is
/// not passed to a request waiting in line, which opens a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_from_before_a_clear_is_not_passed_on() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let pool = pool(&server);
    let id: [&[u8]; 2] = [b"CLIENT", b"ID"];
    let holders: Vec<_> = (0..MAX_OPEN)
        .map(|_| {
            let p = pool.clone();
            tokio::spawn(async move {
                let block: [&[u8]; 3] = [b"BLPOP", b"nothing", b"1"];
                let r = p.pipeline(&[&id[..], &block[..]]).await.unwrap();
                r[0].int().unwrap()
            })
        })
        .collect();
    while busy(&pool).0 < MAX_OPEN {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiting = {
        let p = pool.clone();
        tokio::spawn(async move { p.pipeline(&[id]).await.unwrap()[0].int().unwrap() })
    };
    while busy(&pool).1 < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.clear();
    let mut old = Vec::new();
    for h in holders {
        old.push(h.await.unwrap());
    }
    let new = waiting.await.unwrap();
    assert!(
        !old.contains(&new),
        "connection {new} was opened before the clear"
    );
    assert_eq!(busy(&pool), (0, 0));
}

/// A batch whose own caller gives up mid-exchange answers the requests it carried
/// with an error and frees its slot: nothing waits forever, nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_given_up_mid_exchange_answers_its_riders_and_frees_its_slot() {
    let server = RedisServer::start().expect("redis-server must be installed");
    let pool = pool(&server);
    // Each holder blocks on a list of its own, so that they come free one at a time, in
    // the order this test chooses: two coming free together would each lead a batch.
    let holders: Vec<_> = (0..MAX_OPEN)
        .map(|i| {
            let p = pool.clone();
            tokio::spawn(async move {
                let list = format!("hold{i}");
                let cmd: [&[u8]; 3] = [b"BLPOP", list.as_bytes(), b"30"];
                p.pipeline(&[cmd]).await.unwrap();
            })
        })
        .collect();
    while busy(&pool).0 < MAX_OPEN {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Queued first: its task leads the next batch, whose first command blocks.
    let lead = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let cmd: [&[u8]; 3] = [b"BLPOP", b"nothing", b"10"];
            pool.pipeline(&[cmd]).await
        })
    };
    while busy(&pool).1 < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rider = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let cmd: [&[u8]; 1] = [b"PING"];
            pool.pipeline(&[cmd]).await
        })
    };
    while busy(&pool).1 < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // One connection comes free: it goes to the lead, which takes the rider along.
    server.cli(&["LPUSH", "hold0", "x"]).unwrap();
    while busy(&pool).1 > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 1..MAX_OPEN {
        server.cli(&["LPUSH", &format!("hold{i}"), "x"]).unwrap();
    }
    for h in holders {
        h.await.unwrap();
    }
    // The other holders' connections went back to idle.
    while busy(&pool).0 > 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    lead.abort();
    assert!(lead.await.unwrap_err().is_cancelled());
    let answer = tokio::time::timeout(Duration::from_secs(5), rider)
        .await
        .expect("the rider is answered")
        .unwrap();
    assert!(answer.is_err(), "{answer:?}");
    assert_eq!(busy(&pool), (0, 0));
    let ping: [&[u8]; 1] = [b"PING"];
    assert_eq!(
        pool.pipeline(&[ping]).await.unwrap(),
        vec![Reply::Simple("PONG".into())]
    );
}

/// A server at its client limit refuses the pool's second connection. A request that
/// needed it waits for the connection in use and goes out on it (a release must not fail
/// while the registry has a working connection); a pool with no connection in use reports
/// the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_client_limit_a_request_waits_for_the_connection_in_use() {
    let server = RedisServer::start().expect("redis-server must be installed");
    // The test's own connection, opened first: the server's first client.
    let admin = pool(&server);
    let ping: [&[u8]; 1] = [b"PING"];
    admin.pipeline(&[ping]).await.unwrap();
    let pool = pool(&server);
    let limit: [&[u8]; 4] = [b"CONFIG", b"SET", b"maxclients", b"2"];
    assert_eq!(
        pool.pipeline(&[limit]).await.unwrap(),
        vec![Reply::Simple("OK".into())]
    );
    // The pool's only connection blocks until the test pushes to `go`.
    let holder = {
        let p = pool.clone();
        tokio::spawn(async move {
            let cmd: [&[u8]; 3] = [b"BLPOP", b"go", b"30"];
            p.pipeline(&[cmd]).await.unwrap();
        })
    };
    while busy(&pool).0 < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiting = {
        let p = pool.clone();
        tokio::spawn(async move {
            let incr: [&[u8]; 2] = [b"INCR", b"counted"];
            p.pipeline(&[incr]).await
        })
    };
    // Refused, it gave its slot back and stands in line.
    while busy(&pool) != (1, 1) {
        assert!(!waiting.is_finished(), "{:?}", waiting.await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Another pool, with no connection of its own in use, gets the refusal.
    let other = self::pool(&server);
    let refused = other.pipeline(&[ping]).await.unwrap_err();
    assert!(refused.refused(), "{refused:?}");
    assert_eq!(busy(&other), (0, 0));
    // The blocked connection comes free and carries the waiting request.
    let push: [&[u8]; 3] = [b"RPUSH", b"go", b"x"];
    admin.pipeline(&[push]).await.unwrap();
    holder.await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), vec![Reply::Int(1)]);
    assert_eq!(busy(&pool), (0, 0));
    let stats: [&[u8]; 2] = [b"INFO", b"stats"];
    let info = match &admin.pipeline(&[stats]).await.unwrap()[0] {
        Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        r => panic!("INFO: {r:?}"),
    };
    let rejected = info_stat(&info, "rejected_connections");
    assert!(rejected >= 2, "{rejected} connections refused");
}
