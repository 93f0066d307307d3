//! What the tests of `distlock serve` share: a service process on a free port and an HTTP
//! client for it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// How long a service may take to start and print its address.
const START: Duration = Duration::from_secs(20);

/// A running `distlock serve`, killed on drop.
pub struct Served {
    pub child: Child,
    /// `http://127.0.0.1:PORT` (or https).
    pub base: String,
    pub home: tempfile::TempDir,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Served {
    /// `distlock --backend BACKEND serve --listen 127.0.0.1:0 EXTRA...`.
    pub fn start(backend: &str, extra: &[&str]) -> Served {
        Served::start_on(backend, "127.0.0.1:0", extra)
    }

    /// `distlock --backend BACKEND serve --listen LISTEN EXTRA...`.
    pub fn start_on(backend: &str, listen: &str, extra: &[&str]) -> Served {
        let home = tempfile::tempdir().expect("temporary directory");
        let mut child = Command::new(BIN)
            .args(["--backend", backend, "serve", "--listen", listen])
            .args(extra)
            .env("DISTLOCK_HOME", home.path())
            .env_remove("DISTLOCK_BACKEND")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distlock serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let out = std::thread::spawn(move || {
            let mut first = String::new();
            let _ = stdout.read_line(&mut first);
            let _ = tx.send(first.clone());
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
            first + &rest
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let first = rx.recv_timeout(START).unwrap_or_default();
        let Some(base) = first.trim().strip_prefix("distlock serve: listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve did not start: {first:?}, stderr {:?}",
                err.join().unwrap_or_default()
            );
        };
        Served {
            base: base.to_owned(),
            child,
            home,
            stdout: Some(out),
            stderr: Some(err),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn signal(&self, sig: Signal) {
        let pid = i32::try_from(self.child.id()).unwrap();
        kill(Pid::from_raw(pid), sig).expect("kill(2) on our own child");
    }

    /// Waits at most `bound` for the process to exit; its exit code, stdout and stderr.
    pub fn wait(mut self, bound: Duration) -> (Option<i32>, String, String) {
        let deadline = std::time::Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let out = self.stdout.take().unwrap().join().unwrap_or_default();
                let err = self.stderr.take().unwrap().join().unwrap_or_default();
                return (status.code(), out, err);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serve still running after {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The port the service listens on.
pub fn port_of(served: &Served) -> u16 {
    let port = served.base.rsplit(':').next().unwrap_or_default();
    port.parse()
        .unwrap_or_else(|_| panic!("no port in {}", served.base))
}

/// One HTTP/1.1 request written as is (`head` ends with the blank line, `Connection: close`
/// included) to 127.0.0.1:`port`; the answer's status and body. For the headers a client
/// library would not send as given (`Host`).
pub fn raw(port: u16, head: &str, body: &str) -> (u16, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer");
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `POST /demo` with `body`.
pub async fn post_demo(
    http: &reqwest::Client,
    served: &Served,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    send(http.post(served.url("/demo")).json(&body)).await
}

/// Waits (at most `bound`) for the `demo_ended` event of demonstration `demo` in the list's
/// timeline, and returns it.
pub async fn demo_ended(
    http: &reqwest::Client,
    served: &Served,
    demo: u64,
    bound: Duration,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let (status, list) = send(http.get(served.url("/v1/locks"))).await;
        assert_eq!(status, 200, "{list}");
        let ended = list["timeline"].as_array().and_then(|events| {
            events
                .iter()
                .find(|e| e["kind"] == "demo_ended" && e["demo"] == demo)
                .cloned()
        });
        if let Some(event) = ended {
            return event;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "demonstration {demo} did not end within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `sqlite://` URL of a fresh file in `dir`.
pub fn sqlite_in(dir: &std::path::Path) -> String {
    format!("sqlite://{}", dir.join("locks.db").display())
}

/// An HTTP/1.1 client (keep-alive) without a timeout of its own beyond `bound`.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// Sends `request`; the answer's status and text.
pub async fn text(request: reqwest::RequestBuilder) -> (u16, String) {
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// Sends `request`; the answer's status and JSON body (`Null` when empty or not JSON).
pub async fn send(request: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let (status, text) = text(request).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// `POST /v1/locks/{key}` with `body`.
pub async fn post(
    http: &reqwest::Client,
    served: &Served,
    key: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    send(
        http.post(served.url(&format!("/v1/locks/{}", encode(key))))
            .json(&body),
    )
    .await
}

/// Percent-encodes everything but unreserved characters.
pub fn encode(key: &str) -> String {
    let mut s = String::new();
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The number of waiters `GET /v1/locks` lists.
pub async fn waiters(http: &reqwest::Client, served: &Served) -> usize {
    let (_, list) = send(http.get(served.url("/v1/locks"))).await;
    list["waiters"].as_array().map_or(0, Vec::len)
}

/// The locks `GET /v1/locks` lists, by key.
pub async fn listed(http: &reqwest::Client, served: &Served) -> serde_json::Value {
    let (status, list) = send(http.get(served.url("/v1/locks"))).await;
    assert_eq!(status, 200, "{list}");
    list
}

pub fn lock_of<'a>(list: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    list["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .find(|l| l["key"] == key)
        .unwrap_or_else(|| panic!("{key} not listed: {list}"))
}

/// The keys `GET /v1/locks` lists.
pub async fn listed_keys(http: &reqwest::Client, served: &Served) -> Vec<String> {
    let (status, list) = send(http.get(served.url("/v1/locks"))).await;
    assert_eq!(status, 200, "{list}");
    list["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .map(|l| l["key"].as_str().unwrap().to_owned())
        .collect()
}

/// `GET /v1/locks/{key}`: the backend's state of the key (`status --json`).
pub async fn state_of(http: &reqwest::Client, served: &Served, key: &str) -> serde_json::Value {
    let (status, state) = send(http.get(served.url(&format!("/v1/locks/{}", encode(key))))).await;
    assert_eq!(status, 200, "{state}");
    state
}

/// `PUT /v1/locks/{key}/{token}` with `lease_ms`; the status.
pub async fn extend(
    http: &reqwest::Client,
    served: &Served,
    key: &str,
    token: &str,
    lease_ms: u64,
) -> u16 {
    let url = served.url(&format!("/v1/locks/{}/{token}", encode(key)));
    send(
        http.put(url)
            .json(&serde_json::json!({ "lease_ms": lease_ms })),
    )
    .await
    .0
}

/// `DELETE /v1/locks/{key}/{token}`; the status.
pub async fn release(http: &reqwest::Client, served: &Served, key: &str, token: &str) -> u16 {
    let url = served.url(&format!("/v1/locks/{}/{token}", encode(key)));
    send(http.delete(url)).await.0
}

/// The token of a granted hold.
pub fn token_of(granted: &serde_json::Value) -> String {
    granted["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {granted}"))
        .to_owned()
}

/// A `distlock --backend URL run --key KEY EXTRA... -- sh -c '...'` whose command has started
/// (it touched a marker file), killed on drop.
pub struct CliHolder {
    pub child: Child,
}

impl CliHolder {
    pub fn start(url: &str, dir: &std::path::Path, key: &str, extra: &[&str]) -> CliHolder {
        let marker = dir.join(format!("running-{key}-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        let mut child = Command::new(BIN)
            .args(["--backend", url, "run", "--key", key])
            .args(extra)
            .args(["--", "sh", "-c", "touch \"$0\"; exec sleep 60"])
            .arg(&marker)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("distlock run");
        let deadline = std::time::Instant::now() + START;
        while !marker.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                panic!("the CLI holder of {key:?} {extra:?} ended with {status}: {err}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the CLI holder did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        CliHolder { child }
    }

    /// SIGTERM, then waits for it: its command ends and the lock is released.
    pub fn stop(mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for CliHolder {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `distlock --backend URL ARGS...` to completion.
pub fn cli(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["--backend", url])
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("distlock")
}
