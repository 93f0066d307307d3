//! `distlock serve` over a real HTTP client: every row of the contract (docs/SERVE.md), bad
//! input, tokens, an unreachable backend, caller-owned leases, events and shutdown. Shared
//! holds, permits and the list are in `serve_api/kinds.rs`; requests from other sites, the
//! listening rule and the demonstration in `serve_api/network.rs`.

#[path = "serve_api/kinds.rs"]
mod kinds;
#[path = "serve_api/network.rs"]
mod network;
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

    let (status, started) = post_demo(
        &http,
        &served,
        json!({"key": "d", "workers": 2, "hold_ms": 50}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["key"], "d");

    // Every operation the document describes is served: none falls to the router's
    // "no such route" or "method not allowed here".
    for (path, operations) in api["paths"].as_object().unwrap() {
        let path = path.replace("{key}", "probe").replace("{token}", "0");
        for method in operations.as_object().unwrap().keys() {
            let method = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            if path == "/v1/events" {
                continue; // a stream that does not end; served, as the page's test shows
            }
            let request = http
                .request(method.clone(), served.url(&path))
                .header("content-type", "application/json");
            let (status, answer) = text(request).await;
            assert!(
                status != 404 && status != 405,
                "{method} {path}: {status} {answer}"
            );
        }
    }
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
async fn holds_name_their_owner_or_the_callers_address() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (status, _) = post(&http, &served, "o1", json!({"owner": "billing job"})).await;
    assert_eq!(status, 200);
    let (_, one) = send(http.get(served.url("/v1/locks/o1"))).await;
    assert_eq!(one["owners"], json!(["billing job"]), "{one}");

    let (status, _) = post(&http, &served, "o2", json!({})).await;
    assert_eq!(status, 200);
    let (_, list) = send(http.get(served.url("/v1/locks"))).await;
    let o2 = list["locks"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["key"] == "o2"))
        .unwrap_or_else(|| panic!("o2 not listed: {list}"));
    let owner = o2["owners"][0].as_str().unwrap_or_default();
    assert!(owner.starts_with("http 127.0.0.1:"), "{o2}");

    let (status, bad) = post(&http, &served, "o3", json!({"owner": "https://x"})).await;
    assert_eq!(status, 400, "{bad}");
    let (_, free) = send(http.get(served.url("/v1/locks/o3"))).await;
    assert_eq!(free["held"], json!(false), "{free}");
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
    let r = http.post(served.url("/v1/locks/k"));
    let r = send(
        r.header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
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
    // A broken percent-encoding is refused, not taken as the literal key "%ZZ".
    for path in ["/v1/locks/%ZZ", "/v1/locks/k%2", "/v1/locks/%"] {
        let (status, answer) = send(http.post(served.url(path))).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(answer["error"].is_string(), "{path}: {answer}");
    }
    for body in [
        json!({"workers": 0}),
        json!({"workers": 11}),
        json!({"hold_ms": 5001}),
        json!({"hold_ms": 0}),
        json!({"hold": "3s"}),
        json!({"key": ""}),
    ] {
        let (status, answer) = post_demo(&http, &served, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }

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
    let mut redis = distlock_testkit::redis::RedisServer::start().expect("redis-server");
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
    let slack = distlock_testkit::timing::scheduling_slack().await;
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
    let ca =
        distlock_testkit::tls::TestCa::new(&["localhost", "127.0.0.1"], "client").expect("test CA");
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
