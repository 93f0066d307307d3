//! `distlock serve` over a real HTTP client: every row of docs/SERVE.md, bad input, tokens, an
//! unreachable backend, caller-owned leases, events and shutdown; shared holds and permits
//! (on `memory://`, the one backend with every kind on this branch), and the list.

mod serve_support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_support::*;

#[tokio::test]
async fn every_row_of_the_contract_answers_as_designed() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let key = "voucher/42 ünï";

    let (status, granted) = post(&http, &served, key, json!({"lease_ms": 5000})).await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["key"], key);
    assert_eq!(granted["lease_ms"], 5000);
    let fence = granted["fence"].as_u64().expect("fence");
    let token = granted["token"].as_str().expect("token").to_owned();

    let (status, busy) = post(&http, &served, key, json!({})).await;
    assert_eq!(status, 409, "{busy}");
    assert!(busy["error"].is_string(), "{busy}");

    let path = format!("/v1/locks/{}", encode(key));
    let (status, state) = send(http.get(served.url(&path))).await;
    assert_eq!(status, 200);
    assert_eq!(state["key"], key);
    assert_eq!(state["held"], true);
    assert_eq!(state["fence"], fence, "the status fence is the holder's");
    assert_eq!(state["backend"], "memory");
    let left = state["remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 5000, "{state}");

    assert_eq!(listed_keys(&http, &served).await, [key]);

    let hold = format!("{path}/{token}");
    let put = http.put(served.url(&hold)).json(&json!({"lease_ms": 8000}));
    let (status, extended) = send(put).await;
    assert_eq!(status, 200, "{extended}");
    let left = extended["remaining_ms"].as_u64().unwrap();
    assert!(left > 5000 && left <= 8000, "{extended}");

    assert_eq!(send(http.delete(served.url(&hold))).await.0, 204);
    let (status, gone) = send(http.delete(served.url(&hold))).await;
    assert_eq!(status, 410, "{gone}");
    let put = http.put(served.url(&hold)).json(&json!({"lease_ms": 8000}));
    assert_eq!(send(put).await.0, 410);
    let (_, state) = send(http.get(served.url(&path))).await;
    assert_eq!(state["held"], false);
    assert!(listed_keys(&http, &served).await.is_empty());

    assert_eq!(
        text(http.get(served.url("/healthz"))).await,
        (200, "ok\n".into())
    );

    let (status, metrics) = text(http.get(served.url("/metrics"))).await;
    assert_eq!(status, 200);
    for name in [
        "distlock_http_requests_total",
        "distlock_acquire_total",
        "distlock_release_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from {metrics}");
    }

    let (status, api) = send(http.get(served.url("/v1/openapi.json"))).await;
    assert_eq!(status, 200);
    assert!(api["openapi"].as_str().unwrap().starts_with("3."));
    for p in [
        "/v1/locks/{key}",
        "/v1/locks/{key}/{token}",
        "/v1/locks",
        "/v1/events",
        "/demo",
    ] {
        assert!(api["paths"][p].is_object(), "{p} missing");
    }

    let (status, page) = text(http.get(served.url("/"))).await;
    assert_eq!(status, 200);
    assert!(page.contains("page.js"));
    let (_, script) = text(http.get(served.url("/page.js"))).await;
    assert!(script.contains("EventSource"));

    let demo = text(http.get(served.url("/demo?key=d&workers=2&hold=50ms"))).await;
    assert_eq!(demo, (200, "OK\n".into()));
}

#[tokio::test]
async fn a_waiting_request_gets_the_lock_when_the_holder_releases() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (_, first) = post(&http, &served, "w", json!({"lease_ms": 30000})).await;
    let token = first["token"].as_str().unwrap().to_owned();

    let waiting = {
        let http = http.clone();
        let url = served.url("/v1/locks/w");
        tokio::spawn(async move { send(http.post(url).json(&json!({"wait_ms": 20000}))).await })
    };
    // The waiter shows in the list before the holder lets go.
    let listed = async {
        loop {
            let (_, list) = send(http.get(served.url("/v1/locks"))).await;
            if list["waiters"].as_array().is_some_and(|w| w.len() == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), listed)
        .await
        .expect("the waiter is listed");
    let released = send(http.delete(served.url(&format!("/v1/locks/w/{token}")))).await;
    assert_eq!(released.0, 204);
    let (status, second) = waiting.await.unwrap();
    assert_eq!(status, 200, "{second}");
    assert!(second["fence"].as_u64() > first["fence"].as_u64());

    // A wait that ends before the holder lets go is a 409 after at least the wait.
    let started = Instant::now();
    let (status, busy) = post(&http, &served, "w", json!({"wait_ms": 200})).await;
    assert_eq!(status, 409, "{busy}");
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn bad_input_answers_400_and_leaves_nothing_held() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let long = "k".repeat(1025);
    let cases: Vec<(&str, String, Value)> = vec![
        ("unknown field", "k".into(), json!({"lease": 5})),
        ("lease too short", "k".into(), json!({"lease_ms": 0})),
        (
            "lease too long",
            "k".into(),
            json!({"lease_ms": 1u64 << 40}),
        ),
        ("negative wait", "k".into(), json!({"wait_ms": -1})),
        ("wait too long", "k".into(), json!({"wait_ms": 1u64 << 40})),
        ("wrong type", "k".into(), json!({"lease_ms": "5s"})),
        (
            "shared and permits",
            "k".into(),
            json!({"shared": true, "permits": 3}),
        ),
        ("no permits", "k".into(), json!({"permits": 0})),
        (
            "too many permits",
            "k".into(),
            json!({"permits": 1_000_001}),
        ),
        ("negative permits", "k".into(), json!({"permits": -1})),
        ("shared not a boolean", "k".into(), json!({"shared": "yes"})),
        ("key too long", long, json!({})),
    ];
    for (what, key, body) in cases {
        let (status, answer) = post(&http, &served, &key, body).await;
        assert_eq!(status, 400, "{what}: {answer}");
        assert!(answer["error"].is_string(), "{what}: {answer}");
    }
    let r = send(http.post(served.url("/v1/locks/k")).body("{not json")).await;
    let (status, answer) = r;
    assert_eq!(status, 400, "{answer}");
    let r = send(http.post(served.url("/v1/locks/%FF"))).await;
    let (status, answer) = r;
    assert_eq!(status, 400, "invalid UTF-8 in the key: {answer}");
    let r = send(
        http.put(served.url("/v1/locks/k/0000"))
            .json(&json!({"lease_ms": 0})),
    )
    .await;
    assert_eq!(r.0, 400);
    let r = send(http.get(served.url("/demo?workers=0"))).await;
    assert_eq!(r.0, 400);
    let r = send(http.get(served.url("/demo?hold=abc"))).await;
    assert_eq!(r.0, 400);

    assert!(listed_keys(&http, &served).await.is_empty());
    let (_, state) = send(http.get(served.url("/v1/locks/k"))).await;
    assert_eq!(state["held"], false);
}

#[tokio::test]
async fn requests_without_the_right_bearer_token_answer_401() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let served = Served::start("memory://", &["--token-file", token_file.to_str().unwrap()]);
    let http = client();
    for path in ["/v1/locks", "/", "/healthz", "/v1/events", "/metrics"] {
        let r = send(http.get(served.url(path))).await;
        assert_eq!(r.0, 401, "{path} without a token");
    }
    let (status, answer) = post(&http, &served, "t", json!({})).await;
    assert_eq!(status, 401);
    assert!(answer["error"].is_string());
    let r = send(http.post(served.url("/v1/locks/t")).bearer_auth("wrong")).await;
    assert_eq!(r.0, 401);
    let r = send(http.get(served.url("/v1/locks/t")).bearer_auth("s3cret")).await;
    let (status, state) = r;
    assert_eq!(status, 200);
    assert_eq!(
        state["held"], false,
        "nothing was taken by the refused requests"
    );
    let r = send(http.get(served.url("/v1/locks?access_token=s3cret"))).await;
    assert_eq!(r.0, 200, "the page's EventSource passes it in the query");
}

#[tokio::test]
async fn an_unreachable_backend_answers_503_and_nothing_is_held() {
    let mut redis = distlock::testkit::redis::RedisServer::start().expect("redis-server");
    let served = Served::start(&redis.url(), &[]);
    let http = client();
    let (status, ok) = post(&http, &served, "r", json!({"lease_ms": 5000})).await;
    assert_eq!(status, 200, "{ok}");
    let token = ok["token"].as_str().unwrap().to_owned();
    // Whether this backend lists its locks (then the list needs it, else it is the board's).
    let lists = listed(&http, &served).await["complete"] == true;
    redis.kill();

    let (status, answer) = post(&http, &served, "r2", json!({})).await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer["error"].is_string());
    let r = send(http.get(served.url("/v1/locks/r2"))).await;
    assert_eq!(r.0, 503);
    let r = send(
        http.put(served.url(&format!("/v1/locks/r/{token}")))
            .json(&json!({"lease_ms": 5000})),
    )
    .await;
    assert_eq!(r.0, 503);
    let (status, list) = send(http.get(served.url("/v1/locks"))).await;
    if lists {
        assert_eq!(status, 503, "the list needs the backend: {list}");
        assert!(list["error"].is_string(), "{list}");
    } else {
        assert_eq!(status, 200, "{list}");
        assert_eq!(
            list["holds"].as_array().unwrap().len(),
            1,
            "only the earlier hold"
        );
        assert_eq!(list["locks"][0]["key"], "r");
    }
    let r = send(http.get(served.url("/healthz"))).await;
    assert_eq!(r.0, 200, "the service itself is alive");
}

#[tokio::test]
async fn a_hold_neither_extended_nor_released_ends_with_its_lease() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let lease = Duration::from_millis(300);
    let (status, granted) = post(&http, &served, "e", json!({"lease_ms": 300})).await;
    let answered = Instant::now();
    assert_eq!(status, 200, "{granted}");
    let token = granted["token"].as_str().unwrap().to_owned();

    // The service counts the lease from before its request to the backend, which is before
    // its answer: a lease after the answer, the hold has ended.
    tokio::time::sleep((answered + lease).saturating_duration_since(Instant::now())).await;
    // The service ends it by itself, with a `lost` event, before anybody asks.
    let slack = distlock::testkit::timing::scheduling_slack().await;
    let deadline = Instant::now() + slack;
    let list = loop {
        let list = listed(&http, &served).await;
        if list["holds"].as_array().is_some_and(Vec::is_empty) {
            break list;
        }
        assert!(Instant::now() < deadline, "still on the board: {list}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let lost = list["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "lost" && e["key"] == "e" && e["fence"] == granted["fence"]);
    assert!(lost, "{list}");
    let hold = served.url(&format!("/v1/locks/e/{token}"));
    let put = http.put(&hold).json(&json!({"lease_ms": 5000}));
    assert_eq!(send(put).await.0, 410);
    assert_eq!(send(http.delete(&hold)).await.0, 410);
    // The key is free for the next caller: it gets it within a lease at most.
    let (status, next) = post(&http, &served, "e", json!({"wait_ms": 300})).await;
    assert_eq!(status, 200, "{next}");
    assert!(next["fence"].as_u64() > granted["fence"].as_u64());
}

#[tokio::test]
async fn events_report_acquired_and_released_holds() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let mut stream = http.get(served.url("/v1/events")).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    assert!(stream.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));

    let (_, granted) = post(&http, &served, "ev", json!({})).await;
    let token = granted["token"].as_str().unwrap();
    let r = send(http.delete(served.url(&format!("/v1/locks/ev/{token}")))).await;
    assert_eq!(r.0, 204);

    let mut text = String::new();
    let read = async {
        while !text.contains("event: released") {
            let chunk = stream.chunk().await.unwrap().expect("stream open");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("both events arrive");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_owned(), serde_json::from_str(data).unwrap()))
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["acquired", "released"], "{text}");
    for (_, e) in &events {
        assert_eq!(e["key"], "ev");
        assert_eq!(e["fence"], granted["fence"]);
    }
}

#[tokio::test]
async fn an_http_holder_and_a_cli_holder_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_in(dir.path());
    let served = Served::start(&url, &[]);
    let http = client();
    let cli = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(["--backend", &url])
            .args(args)
            .output()
            .expect("distlock")
    };

    let (status, granted) = post(&http, &served, "x", json!({"lease_ms": 30000})).await;
    assert_eq!(status, 200, "{granted}");
    let out = cli(&["run", "--key", "x", "--no-wait", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "the CLI finds it busy: {out:?}"
    );
    let out = cli(&["status", "x", "--json"]);
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["fence"], granted["fence"]);
    let token = granted["token"].as_str().unwrap();
    let r = send(http.delete(served.url(&format!("/v1/locks/x/{token}")))).await;
    assert_eq!(r.0, 204);

    // A CLI holder: its command signals that it runs, then waits to be killed.
    let marker = dir.path().join("running");
    let mut holder = std::process::Command::new(BIN)
        .args(["--backend", &url, "run", "--key", "x", "--", "sh", "-c"])
        .arg("touch \"$0\"; exec sleep 30")
        .arg(&marker)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("distlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the CLI holder did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, busy) = post(&http, &served, "x", json!({})).await;
    assert_eq!(status, 409, "the service finds it busy: {busy}");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(holder.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = holder.wait();
    let (status, granted) = post(&http, &served, "x", json!({"wait_ms": 5000})).await;
    assert_eq!(status, 200, "{granted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_open_holds_and_their_tokens_answer_410() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_in(dir.path());
    let served = Served::start(&url, &[]);
    let http = client();
    let (status, granted) = post(&http, &served, "s", json!({"lease_ms": 60000})).await;
    assert_eq!(status, 200, "{granted}");
    // An open event stream and a waiting request do not hold the shutdown up.
    let mut stream = http.get(served.url("/v1/events")).send().await.unwrap();
    let waiting = {
        let (http, url) = (http.clone(), served.url("/v1/locks/s"));
        tokio::spawn(async move { send(http.post(url).json(&json!({"wait_ms": 30000}))).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiters(&http, &served).await != 1 {
        assert!(Instant::now() < deadline, "the waiter is listed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    served.signal(nix::sys::signal::Signal::SIGTERM);
    let (status, answer) = waiting.await.unwrap();
    assert_eq!(status, 503, "the wait ends with the service: {answer}");
    while stream.chunk().await.unwrap().is_some() {}
    let (code, _, stderr) = tokio::task::block_in_place(|| served.wait(Duration::from_secs(20)));
    assert_eq!(code, Some(0), "{stderr}");

    let out = std::process::Command::new(BIN)
        .args(["--backend", &url, "status", "s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "released at shutdown: {out:?}");

    let next = Served::start(&url, &[]);
    let token = granted["token"].as_str().unwrap();
    let r = send(
        http.put(next.url(&format!("/v1/locks/s/{token}")))
            .json(&json!({"lease_ms": 5000})),
    )
    .await;
    assert_eq!(r.0, 410);
}

#[tokio::test]
async fn tls_serves_https_with_the_given_certificate() {
    let ca = distlock::testkit::tls::TestCa::new(&["localhost", "127.0.0.1"], "client")
        .expect("openssl");
    let (cert, key) = ca.server_cert_and_key();
    let served = Served::start(
        "memory://",
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(served.base.starts_with("https://"), "{}", served.base);
    let root = reqwest::Certificate::from_pem(&std::fs::read(ca.ca_cert()).unwrap()).unwrap();
    let https = reqwest::Client::builder()
        .add_root_certificate(root)
        .build()
        .unwrap();
    let (status, granted) = post(&https, &served, "tls", json!({})).await;
    assert_eq!(status, 200, "{granted}");
    let plain = served.base.replacen("https://", "http://", 1);
    assert!(client()
        .get(format!("{plain}/healthz"))
        .send()
        .await
        .is_err());
}

/// The number of waiters `GET /v1/locks` lists.
async fn waiters(http: &reqwest::Client, served: &Served) -> usize {
    let (_, list) = send(http.get(served.url("/v1/locks"))).await;
    list["waiters"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_wait_the_caller_abandons_leaves_nothing_behind() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (_, first) = post(&http, &served, "a", json!({})).await;
    let waiting = {
        let http = client();
        let url = served.url("/v1/locks/a");
        tokio::spawn(async move { http.post(url).json(&json!({"wait_ms": 60000})).send().await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiters(&http, &served).await != 1 {
        assert!(Instant::now() < deadline, "the waiter is listed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    waiting.abort(); // drops the connection
    while waiters(&http, &served).await != 0 {
        assert!(Instant::now() < deadline, "the waiter is gone");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let token = first["token"].as_str().unwrap();
    let r = send(http.delete(served.url(&format!("/v1/locks/a/{token}")))).await;
    assert_eq!(r.0, 204);
    let (_, state) = send(http.get(served.url("/v1/locks/a"))).await;
    assert_eq!(state["held"], false, "the abandoned waiter took nothing");
}

#[test]
fn bad_serve_options_are_usage_errors_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.path().join("missing");
    let any = "127.0.0.1:0";
    let cases: [&[&str]; 5] = [
        &["--listen", any, "--token-file", missing.to_str().unwrap()],
        &["--listen", any, "--token-file", empty.to_str().unwrap()],
        &["--listen", any, "--tls-cert", missing.to_str().unwrap()],
        &[
            "--listen",
            any,
            "--tls-cert",
            "c",
            "--tls-key",
            missing.to_str().unwrap(),
        ],
        &["--listen", "not-an-address"],
    ];
    for extra in cases {
        let out = std::process::Command::new(BIN)
            .args(["--backend", "memory://", "serve"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{extra:?}: {stderr}");
        assert!(out.stdout.is_empty(), "never started listening: {out:?}");
    }
}

/// The README's Python client (standard library only) against a real service: it takes the
/// lock, extends it while it works, and releases it.
#[test]
fn the_python_client_example_holds_extends_and_releases() {
    let served = Served::start("memory://", &[]);
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/client.py"))
        .args([served.base.as_str(), "voucher:42"])
        .output()
        .expect("python3 must be installed (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("holding voucher:42 with fence "),
        "{stdout}"
    );
    assert!(stdout.contains("step 2 done, lease left "), "{stdout}");
    assert!(stdout.trim_end().ends_with("released"), "{stdout}");
}

/// The locks `GET /v1/locks` lists, by key.
async fn listed(http: &reqwest::Client, served: &Served) -> Value {
    let (status, list) = send(http.get(served.url("/v1/locks"))).await;
    assert_eq!(status, 200, "{list}");
    list
}

fn lock_of<'a>(list: &'a Value, key: &str) -> &'a Value {
    list["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .find(|l| l["key"] == key)
        .unwrap_or_else(|| panic!("{key} not listed: {list}"))
}

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
    let slack = distlock::testkit::timing::scheduling_slack().await;
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
    let server = distlock::testkit::postgres::PostgresServer::machine_or_start()
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
