//! Shared holds and permits over HTTP (on `memory://`, and across processes on SQLite), and
//! how the list shows them.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::serve_support::*;

#[tokio::test]
async fn shared_http_holds_share_the_key_and_exclude_exclusive_ones() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (status, a) = post(&http, &served, "rw", json!({"shared": true})).await;
    assert_eq!(status, 200, "{a}");
    let (status, b) = post(
        &http,
        &served,
        "rw",
        json!({"shared": true, "lease_ms": 9000}),
    )
    .await;
    assert_eq!(status, 200, "a second reader shares the key: {b}");
    assert!(b["fence"].as_u64() > a["fence"].as_u64(), "{a} {b}");

    let state = state_of(&http, &served, "rw").await;
    assert_eq!(state["kind"], "read", "{state}");
    assert_eq!(state["holders"], 2, "two holds on the backend: {state}");

    for body in [json!({}), json!({"wait_ms": 100}), json!({"permits": 2})] {
        let (status, busy) = post(&http, &served, "rw", body.clone()).await;
        assert_eq!(status, 409, "{body} beside readers: {busy}");
    }

    let list = listed(&http, &served).await;
    assert_eq!(list["complete"], true, "memory:// lists its locks: {list}");
    let lock = lock_of(&list, "rw");
    assert_eq!(lock["kind"], "read");
    assert_eq!(lock["holders"], 2);
    assert_eq!(lock["holds_here"], 2);
    assert_eq!(lock["other_holders"], 0);
    let kinds: Vec<&str> = list["holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["read", "read"], "{list}");

    // A writer that waits gets the key once both readers are gone, and keeps readers out.
    let writer = {
        let (http, url) = (http.clone(), served.url("/v1/locks/rw"));
        tokio::spawn(async move { send(http.post(url).json(&json!({"wait_ms": 20000}))).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiters(&http, &served).await != 1 {
        assert!(Instant::now() < deadline, "the writer is listed as waiting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(release(&http, &served, "rw", &token_of(&a)).await, 204);
    assert_eq!(release(&http, &served, "rw", &token_of(&b)).await, 204);
    let (status, w) = writer.await.unwrap();
    assert_eq!(status, 200, "{w}");
    assert_eq!(state_of(&http, &served, "rw").await["kind"], "mutex");
    let (status, busy) = post(&http, &served, "rw", json!({"shared": true})).await;
    assert_eq!(status, 409, "a reader beside the writer: {busy}");
    // A reader that waits gets it when the writer lets go.
    let reader = {
        let (http, url) = (http.clone(), served.url("/v1/locks/rw"));
        tokio::spawn(async move {
            send(
                http.post(url)
                    .json(&json!({"shared": true, "wait_ms": 20000})),
            )
            .await
        })
    };
    while waiters(&http, &served).await != 1 {
        assert!(Instant::now() < deadline, "the reader is listed as waiting");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(release(&http, &served, "rw", &token_of(&w)).await, 204);
    let (status, r) = reader.await.unwrap();
    assert_eq!(status, 200, "{r}");
    assert!(r["fence"].as_u64() > w["fence"].as_u64());
}

#[tokio::test]
async fn permits_admit_at_most_their_number_and_must_agree() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (status, p1) = post(&http, &served, "pool", json!({"permits": 2})).await;
    assert_eq!(status, 200, "{p1}");
    let (status, p2) = post(&http, &served, "pool", json!({"permits": 2})).await;
    assert_eq!(status, 200, "{p2}");
    let (status, busy) = post(&http, &served, "pool", json!({"permits": 2})).await;
    assert_eq!(status, 409, "both permits are taken: {busy}");
    let (status, disagree) = post(&http, &served, "pool", json!({"permits": 3})).await;
    assert_eq!(status, 400, "{disagree}");
    assert!(
        disagree["error"].as_str().unwrap().contains("permit"),
        "{disagree}"
    );
    for body in [json!({}), json!({"shared": true})] {
        let (status, busy) = post(&http, &served, "pool", body.clone()).await;
        assert_eq!(status, 409, "{body} beside permits: {busy}");
    }

    let state = state_of(&http, &served, "pool").await;
    assert_eq!(state["kind"], "semaphore", "{state}");
    assert_eq!(state["permits"], 2, "{state}");
    assert_eq!(state["holders"], 2, "{state}");
    let list = listed(&http, &served).await;
    let lock = lock_of(&list, "pool");
    assert_eq!(lock["kind"], "semaphore");
    assert_eq!(lock["permits"], 2);
    assert_eq!(lock["holds_here"], 2);
    for h in list["holds"].as_array().unwrap() {
        assert_eq!(h["kind"], "semaphore", "{h}");
        assert_eq!(h["permits"], 2, "{h}");
    }

    // Each permit is its own hold: releasing one lets exactly one more in.
    assert_eq!(release(&http, &served, "pool", &token_of(&p1)).await, 204);
    assert_eq!(release(&http, &served, "pool", &token_of(&p1)).await, 410);
    let (status, p3) = post(&http, &served, "pool", json!({"permits": 2})).await;
    assert_eq!(status, 200, "{p3}");
    let (status, _) = post(&http, &served, "pool", json!({"permits": 2})).await;
    assert_eq!(status, 409);
    assert_eq!(
        extend(&http, &served, "pool", &token_of(&p2), 5000).await,
        200
    );
    assert_eq!(release(&http, &served, "pool", &token_of(&p2)).await, 204);
    assert_eq!(release(&http, &served, "pool", &token_of(&p3)).await, 204);
    assert_eq!(state_of(&http, &served, "pool").await["held"], false);
}

/// Each shared HTTP hold is a lease its own caller owns: the registry does not let HTTP
/// readers share one remote read hold, so one reader's extensions keep only its own hold.
#[tokio::test]
async fn a_shared_caller_that_stops_extending_loses_its_hold_while_another_extends() {
    let served = Served::start("memory://", &[]);
    let http = client();
    // Short enough to end soon, long enough that the extending reader's PUTs, one every
    // sixth of it, land in time on this machine.
    let slack = distlock_testkit::timing::scheduling_slack().await;
    let lease = (slack * 2).max(Duration::from_millis(600));
    let lease_ms = u64::try_from(lease.as_millis()).unwrap();
    let body = json!({"shared": true, "lease_ms": lease_ms});
    let (status, quiet) = post(&http, &served, "r", body.clone()).await;
    let quiet_answered = Instant::now();
    assert_eq!(status, 200, "{quiet}");
    let (status, busy) = post(&http, &served, "r", body).await;
    assert_eq!(status, 200, "{busy}");
    let (quiet, busy) = (token_of(&quiet), token_of(&busy));

    // The busy reader extends until well past the quiet one's lease.
    let until = quiet_answered + lease * 2;
    while Instant::now() < until {
        assert_eq!(
            extend(&http, &served, "r", &busy, lease_ms).await,
            200,
            "the extending reader keeps its hold"
        );
        tokio::time::sleep(lease / 6).await;
    }
    assert_eq!(
        extend(&http, &served, "r", &quiet, lease_ms).await,
        410,
        "the quiet reader's lease ended although another reader extended"
    );
    let state = state_of(&http, &served, "r").await;
    assert_eq!(
        state["holders"], 1,
        "only the extending reader holds: {state}"
    );
    let list = listed(&http, &served).await;
    assert_eq!(list["holds"].as_array().unwrap().len(), 1, "{list}");
    // The remaining reader still keeps writers out, until it lets go.
    let (status, _) = post(&http, &served, "r", json!({})).await;
    assert_eq!(status, 409);
    assert_eq!(release(&http, &served, "r", &busy).await, 204);
    let (status, w) = post(&http, &served, "r", json!({})).await;
    assert_eq!(status, 200, "{w}");
}

#[tokio::test]
async fn a_backend_without_the_kind_answers_501() {
    // PostgreSQL in Spring mode (Spring Integration's INT_LOCK table) takes the mutex only,
    // and lists what it holds.
    let server = distlock_testkit::postgres::PostgresServer::machine_or_start()
        .expect("PostgreSQL (scripts/test.sh installs postgresql)");
    let db = server.fresh_database().expect("fresh database");
    let url = format!("{}?spring=true", db.url());
    let served = Served::start(&url, &[]);
    let http = client();
    for body in [
        json!({"shared": true}),
        json!({"permits": 2}),
        json!({"shared": true, "wait_ms": 1000}),
    ] {
        let (status, answer) = post(&http, &served, "k", body.clone()).await;
        assert_eq!(status, 501, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("unsupported"),
            "{answer}"
        );
    }
    // Bad input is still bad input.
    let (status, _) = post(&http, &served, "k", json!({"permits": 0})).await;
    assert_eq!(status, 400);
    assert_eq!(
        state_of(&http, &served, "k").await["held"],
        false,
        "nothing held"
    );

    let (status, granted) = post(&http, &served, "k", json!({})).await;
    assert_eq!(status, 200, "{granted}");
    let list = listed(&http, &served).await;
    assert_eq!(list["complete"], true, "{list}");
    let lock = lock_of(&list, "k");
    assert_eq!(lock["holds_here"], 1, "{lock}");
    assert_eq!(list["holds"][0]["kind"], "mutex");
}

/// Shared and exclusive holds across processes on one backend: an HTTP holder and a
/// `distlock run` holder exclude each other, and the list shows the CLI's hold as somebody
/// else's. Needs a cross-process backend with read-write locks and `list`: the SQLite file,
/// once the SQL backends have the kinds (branch wip-kinds-sql).
#[tokio::test]
async fn http_and_cli_holders_of_the_other_kind_exclude_each_other_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_in(dir.path());
    let served = Served::start(&url, &[]);
    let http = client();

    // HTTP exclusive, CLI shared.
    let (status, granted) = post(&http, &served, "x", json!({"lease_ms": 30000})).await;
    assert_eq!(status, 200, "{granted}");
    let out = cli(
        &url,
        &["run", "--key", "x", "--shared", "--no-wait", "--", "true"],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "a shared run finds it busy: {out:?}"
    );
    assert_eq!(release(&http, &served, "x", &token_of(&granted)).await, 204);

    // CLI shared, HTTP exclusive; another HTTP reader shares with the CLI's.
    let reader = CliHolder::start(&url, dir.path(), "x", &["--shared"]);
    let (status, busy) = post(&http, &served, "x", json!({})).await;
    assert_eq!(
        status, 409,
        "an exclusive HTTP hold beside a CLI reader: {busy}"
    );
    let (status, shared) = post(&http, &served, "x", json!({"shared": true})).await;
    assert_eq!(status, 200, "an HTTP reader beside a CLI reader: {shared}");
    let list = listed(&http, &served).await;
    assert_eq!(list["complete"], true, "{list}");
    let lock = lock_of(&list, "x");
    assert_eq!(lock["kind"], "read", "{lock}");
    assert_eq!(lock["holders"], 2, "{lock}");
    assert_eq!(lock["holds_here"], 1, "{lock}");
    assert_eq!(lock["other_holders"], 1, "the CLI's hold: {lock}");
    reader.stop();
    assert_eq!(release(&http, &served, "x", &token_of(&shared)).await, 204);

    // HTTP shared, CLI exclusive.
    let (status, shared) = post(&http, &served, "x", json!({"shared": true})).await;
    assert_eq!(status, 200, "{shared}");
    let out = cli(&url, &["run", "--key", "x", "--no-wait", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "an exclusive run beside an HTTP reader: {out:?}"
    );
    assert_eq!(release(&http, &served, "x", &token_of(&shared)).await, 204);

    // CLI exclusive, HTTP shared.
    let writer = CliHolder::start(&url, dir.path(), "x", &[]);
    let (status, busy) = post(&http, &served, "x", json!({"shared": true})).await;
    assert_eq!(status, 409, "an HTTP reader beside a CLI writer: {busy}");
    let lock = lock_of(&listed(&http, &served).await, "x").clone();
    assert_eq!(lock["other_holders"], 1, "{lock}");
    writer.stop();
    let (status, shared) = post(
        &http,
        &served,
        "x",
        json!({"shared": true, "wait_ms": 5000}),
    )
    .await;
    assert_eq!(status, 200, "{shared}");
}

/// Many callers at once, each trying once: readers (and permits, while some are left) never
/// turn each other away, although they go through the one registry of the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_shared_and_permit_requests_do_not_turn_each_other_away() {
    let served = Served::start("memory://", &[]);
    let http = client();
    for round in 0..20 {
        let key = format!("burst-{round}");
        let body = if round % 2 == 0 {
            json!({"shared": true})
        } else {
            json!({"permits": 32})
        };
        let posts = (0..32).map(|_| {
            let (http, url) = (http.clone(), served.url(&format!("/v1/locks/{key}")));
            let body = body.clone();
            async move { send(http.post(url).json(&body)).await }
        });
        for (status, answer) in futures_util::future::join_all(posts).await {
            assert_eq!(status, 200, "round {round}, {body}: {answer}");
        }
        assert_eq!(state_of(&http, &served, &key).await["holders"], 32);
    }
}
