//! `distlock serve` on a network: requests from other sites' pages (Origin, Sec-Fetch-Site, a
//! body that is not JSON), hosts that are not the service's (DNS rebinding), listening beyond
//! loopback without a token, and the demonstration (a bounded POST, one at a time, on the
//! service's own connections, released at shutdown).

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use crate::serve_support::*;

/// `POST /v1/locks/{key}` written as is, with `headers` (each ending in CRLF).
fn raw_post(port: u16, key: &str, headers: &str, body: &str) -> (u16, Value) {
    let head = format!(
        "POST /v1/locks/{key} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let (status, text) = raw(port, &head, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn state_changing_requests_from_other_sites_are_refused() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let port = port_of(&served);
    let day = r#"{"lease_ms": 86400000}"#;
    // What a page of another site can send without asking (a "simple" request), and what a
    // browser adds to what a page sends.
    let refused = [
        (
            "Origin: https://evil.example\r\nContent-Type: text/plain\r\n",
            403,
        ),
        (
            "Origin: https://evil.example\r\nContent-Type: application/json\r\n",
            403,
        ),
        ("Origin: null\r\nContent-Type: application/json\r\n", 403),
        (
            "Origin: http://127.0.0.1:1\r\nContent-Type: application/json\r\n",
            403,
        ),
        (
            "Sec-Fetch-Site: cross-site\r\nContent-Type: application/json\r\n",
            403,
        ),
        (
            "Sec-Fetch-Site: same-site\r\nContent-Type: application/json\r\n",
            403,
        ),
        ("Content-Type: text/plain\r\n", 415),
        ("Content-Type: application/x-www-form-urlencoded\r\n", 415),
        ("", 415),
    ];
    for (headers, expected) in refused {
        let (status, answer) = raw_post(port, "k", headers, day);
        assert_eq!(status, expected, "{headers:?}: {answer}");
        assert!(answer["error"].is_string(), "{headers:?}: {answer}");
    }
    assert!(
        listed_keys(&http, &served).await.is_empty(),
        "nothing taken"
    );

    // The service's own page, and programs that send no Origin, pass.
    let own = format!(
        "Origin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin\r\n\
         Content-Type: application/json; charset=utf-8\r\n"
    );
    let (status, granted) = raw_post(port, "k", &own, r#"{"lease_ms": 60000}"#);
    assert_eq!(status, 200, "{granted}");
    let (status, answer) = raw_post(port, "no-body", "", "");
    assert_eq!(
        status, 200,
        "a POST without a body needs no content type: {answer}"
    );

    // Neither can another site extend or release a hold.
    let token = token_of(&granted);
    for method in ["PUT", "DELETE"] {
        let head = format!(
            "{method} /v1/locks/k/{token} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Origin: https://evil.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (status, answer) = raw(port, &head, "");
        assert_eq!(status, 403, "{method}: {answer}");
    }
    assert_eq!(state_of(&http, &served, "k").await["held"], true);
    assert_eq!(release(&http, &served, "k", &token).await, 204);
}

#[tokio::test]
async fn a_host_the_service_does_not_listen_on_is_refused() {
    let served = Served::start("memory://", &["--allow-host", "Locks.Example"]);
    let port = port_of(&served);
    let get = |host: &str| {
        let head = format!("GET /v1/locks HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw(port, &head, "")
    };
    // A page whose name was rebound to 127.0.0.1 names its own host: it reads nothing.
    for host in [
        format!("evil.example:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        "127.0.0.1".to_owned(),
        format!("[::1]:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        let (status, body) = get(&host);
        assert_eq!(status, 403, "Host {host}: {body}");
        assert!(body.contains("--allow-host"), "Host {host}: {body}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "locks.example".to_owned(),
        "LOCKS.EXAMPLE:8443".to_owned(),
    ] {
        let (status, body) = get(&host);
        assert_eq!(status, 200, "Host {host}: {body}");
    }
    // A state-changing request of the allowed name's own page passes.
    let head = "POST /v1/locks/k HTTP/1.1\r\nHost: locks.example\r\n\
                Origin: https://locks.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(port, head, "").0, 200);
}

#[test]
fn listening_beyond_loopback_needs_a_token_or_open() {
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let mut child = std::process::Command::new(BIN)
            .args(["--backend", "memory://", "serve", "--listen", listen])
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve --listen {listen} without a token kept running");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{listen}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("--token-file") && stderr.contains("--open"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty(), "never started listening: {out:?}");
    }
    let health = |served: &Served| {
        let port = port_of(served);
        let head =
            format!("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        raw(port, &head, "")
    };
    let open = Served::start_on("memory://", "0.0.0.0:0", &["--open"]);
    assert_eq!(health(&open), (200, "ok\n".into()));
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token = token.to_str().unwrap();
    let guarded = Served::start_on("memory://", "0.0.0.0:0", &["--token-file", token]);
    assert_eq!(health(&guarded).0, 401, "the token is required");
}

#[tokio::test]
async fn the_demonstration_is_a_bounded_post_one_at_a_time() {
    let served = Served::start("memory://", &[]);
    let http = client();
    let (status, answer) = send(http.get(served.url("/demo?key=d"))).await;
    assert_eq!(status, 405, "a GET starts nothing: {answer}");
    assert!(answer["error"].is_string(), "{answer}");
    let (status, first) = post_demo(
        &http,
        &served,
        json!({"key": "d", "workers": 3, "hold_ms": 300}),
    )
    .await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["workers"], 3);
    let (status, busy) = post_demo(&http, &served, json!({"key": "e"})).await;
    assert_eq!(status, 409, "one demonstration at a time: {busy}");
    let ended = demo_ended(
        &http,
        &served,
        first["demo"].as_u64().unwrap(),
        Duration::from_secs(30),
    )
    .await;
    let report = &ended["demonstration"];
    assert_eq!(report["acquisitions"], 3, "{ended}");
    assert!(report["min_gap_ms"].as_f64().unwrap() >= 300.0, "{ended}");
    assert!(report["max_gap_ms"].as_f64().unwrap() >= report["min_gap_ms"].as_f64().unwrap());
    let (status, second) = post_demo(
        &http,
        &served,
        json!({"key": "d", "workers": 1, "hold_ms": 10}),
    )
    .await;
    assert_eq!(
        status, 202,
        "the next one may start once the first ended: {second}"
    );
    assert_ne!(second["demo"], first["demo"]);
}

/// `connected_clients` of the Redis server.
fn redis_clients(server: &distlock_testkit::redis::RedisServer) -> u64 {
    let info = server.cli(&["INFO", "clients"]).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info}"))
}

/// The workers share the service's connections: a demonstration opens none once the pool has
/// the connections a demonstration needs (the first one's).
#[tokio::test]
async fn the_demonstrations_workers_share_the_services_connections() {
    const WORKERS: u64 = 10;
    let server = distlock_testkit::redis::RedisServer::start().expect("redis-server");
    let served = Served::start(&server.url(), &[]);
    let http = client();
    let body = json!({"key": "shared", "workers": WORKERS, "hold_ms": 20});
    let (status, first) = post_demo(&http, &served, body.clone()).await;
    assert_eq!(status, 202, "{first}");
    let bound = Duration::from_secs(60);
    demo_ended(&http, &served, first["demo"].as_u64().unwrap(), bound).await;
    let before = redis_clients(&server);
    let (status, second) = post_demo(&http, &served, body).await;
    assert_eq!(status, 202, "{second}");
    let during = redis_clients(&server);
    assert!(
        during < before + (WORKERS - 1),
        "a connection (or more) per worker: {before} clients before, {during} during"
    );
    let ended = demo_ended(&http, &served, second["demo"].as_u64().unwrap(), bound).await;
    assert_eq!(ended["demonstration"]["acquisitions"], WORKERS, "{ended}");
}

/// SIGTERM stops the demonstration and its holder releases before the service exits: the
/// key is free at once, not after its lease.
#[tokio::test]
async fn shutdown_releases_the_demonstrations_hold() {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_in(dir.path());
    let served = Served::start(&url, &[]);
    let http = client();
    let (status, started) = post_demo(
        &http,
        &served,
        json!({"key": "shown", "workers": 3, "hold_ms": 5000}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state_of(&http, &served, "shown").await["held"] != true {
        assert!(
            std::time::Instant::now() < deadline,
            "no worker got the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served.signal(Signal::SIGTERM);
    let (code, _, stderr) = served.wait(Duration::from_secs(20));
    assert_eq!(code, Some(0), "{stderr}");
    let out = cli(&url, &["status", "shown", "--json"]);
    let state: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(state["held"], false, "{state} {out:?}");
}
