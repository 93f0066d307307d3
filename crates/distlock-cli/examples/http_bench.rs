//! Acquire + release over HTTP/1.1 keep-alive (`distlock serve`) against the same backend used
//! directly through the library, and the memory of waiters that long-poll the service.
//! `bench/http/run.sh` builds and runs it; `bench/http/README.md` has the results.
//!
//! ```text
//! http_bench --distlock PATH --backend URL [--service-backend URL] [--direct-backend2 URL]
//!            [--seconds N]
//!            [--concurrency C] [--waiters W] [--compare PATH] [--ceiling]
//!            [--ceiling-threads N] [--client reqwest|raw]
//! ```
//!
//! The targets alternate in one-second slices, so that a change of load on the machine falls
//! on all alike:
//! - `direct`: the library in this process; `direct2` (with `--direct-backend2 URL`): the same
//!   on another URL (the same server with other parameters, such as `max_connections`);
//! - `http`: a `distlock serve` of `--distlock`, on `--service-backend` if given (the same
//!   server with other URL parameters, such as `max_connections`), else on `--backend`;
//! - `compare` (with `--compare PATH`): a `distlock serve` of another build (or of the same
//!   build on `--backend` when `--service-backend` differs), for a before and after in one run;
//! - `ceiling` (with `--ceiling`): a hyper HTTP/1.1 server that does nothing (POST answers a
//!   fixed grant, DELETE 204), this program started again with `--null-server`: what the
//!   client, hyper and loopback TCP cost by themselves on this machine;
//! - `ceiling_threads` (with `--ceiling-threads N`): the same on N worker threads (0: Tokio's
//!   current-thread runtime).
//!
//! The client is reqwest (`--client reqwest`, the default: what a Rust program would use), or
//! `--client raw`: requests written and answers read by hand on one keep-alive connection per
//! task, about the least CPU an HTTP/1.1 client can spend, so that on a small machine the
//! client takes less of the CPU the server needs, as a client elsewhere would.
//!
//! For each server it also reports the CPU time the server process and this process used per
//! cycle during its slices (from `/proc`), which does not depend on how busy the machine is.
//!
//! Prints one JSON line: cycles/s of each target, ratios to direct, CPU per cycle, and the
//! service's resident memory before and with W requests waiting for one held key.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockRegistry, RegistryOptions};
use serde_json::{json, Map, Value};

struct Args {
    distlock: String,
    backend: String,
    /// The services' backend URL, when it differs from the library's.
    service_backend: Option<String>,
    /// A second direct target on this URL (the same server with other parameters).
    direct_backend2: Option<String>,
    seconds: u64,
    concurrency: usize,
    waiters: usize,
    compare: Option<String>,
    /// `reqwest` (the default) or `raw`.
    client: String,
    ceiling: bool,
    /// Worker threads of a second ceiling server (0: current-thread runtime).
    ceiling_threads: Option<usize>,
    /// An axum server whose handlers do nothing: the service's overhead is measured against it.
    axum_ceiling: bool,
    /// etcd's own HTTP gateway (`/v3/lock/lock`, `/v3/lock/unlock`) at this URL, as a target.
    etcd_gateway: Option<String>,
    /// The etcd process behind it, whose CPU is the gateway's server CPU.
    etcd_pid: Option<u32>,
}

fn args() -> Args {
    let mut a = Args {
        distlock: "target/release/distlock".into(),
        backend: "memory://".into(),
        service_backend: None,
        direct_backend2: None,
        seconds: 5,
        concurrency: 16,
        waiters: 1000,
        compare: None,
        client: "reqwest".into(),
        ceiling: false,
        ceiling_threads: None,
        axum_ceiling: false,
        etcd_gateway: None,
        etcd_pid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--ceiling" {
            a.ceiling = true;
            continue;
        }
        if flag == "--axum-ceiling" {
            a.axum_ceiling = true;
            continue;
        }
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--distlock" => a.distlock = value,
            "--backend" => a.backend = value,
            "--service-backend" => a.service_backend = Some(value),
            "--direct-backend2" => a.direct_backend2 = Some(value),
            "--seconds" => a.seconds = value.parse().expect("--seconds N"),
            "--concurrency" => a.concurrency = value.parse().expect("--concurrency C"),
            "--waiters" => a.waiters = value.parse().expect("--waiters W"),
            "--compare" => a.compare = Some(value),
            "--etcd-gateway" => a.etcd_gateway = Some(value),
            "--etcd-pid" => a.etcd_pid = Some(value.parse().expect("--etcd-pid PID")),
            "--client" => a.client = value,
            "--ceiling-threads" => {
                a.ceiling_threads = Some(value.parse().expect("--ceiling-threads N"));
            }
            other => panic!("unknown option {other}"),
        }
    }
    a
}

/// Runs `cycle(task)` on `tasks` tasks for `length`; how many cycles, how long it took, and
/// each cycle's latency in microseconds.
async fn measure<F, Fut>(tasks: usize, length: Duration, cycle: F) -> (u64, Duration, Vec<u32>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let cycle = Arc::new(cycle);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (cycle, stop, count) = (cycle.clone(), stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    cycle(i).await;
                    latencies.push(began.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    count.fetch_add(1, Ordering::Relaxed);
                    // An in-process backend never waits: let the timer and the others run.
                    tokio::task::yield_now().await;
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("bench task"));
    }
    (count.load(Ordering::Relaxed), started.elapsed(), latencies)
}

/// The `q` quantile of `latencies` (sorted here), in microseconds.
fn quantile(latencies: &mut [u32], q: f64) -> u32 {
    if latencies.is_empty() {
        return 0;
    }
    latencies.sort_unstable();
    let at = ((latencies.len() - 1) as f64 * q).round() as usize;
    latencies[at]
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// User plus system CPU time of a process (`self` or a pid), from `/proc/PID/stat`.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // The command name may hold spaces; the fields after it are plain.
    let rest = &stat[stat.rfind(')').expect("stat") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) };
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// A server process that prints `... listening on URL` as its first line.
fn start(mut command: Command) -> (Child, String) {
    let mut child = command.stdout(Stdio::piped()).spawn().expect("server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("address line");
    let base = line
        .trim()
        .rsplit_once("listening on ")
        .expect("listening line")
        .1
        .to_owned();
    (child, base)
}

fn start_service(distlock: &str, backend: &str, prefix: &str) -> (Child, String) {
    let mut command = Command::new(distlock);
    command.args([
        "--backend",
        backend,
        "--prefix",
        prefix,
        "serve",
        "--listen",
        "127.0.0.1:0",
    ]);
    start(command)
}

/// The library used directly: 16 tasks, each taking and releasing its own key.
struct Direct {
    name: &'static str,
    registry: LockRegistry,
    cycles: u64,
    elapsed: Duration,
    cpu: Duration,
    latencies: Vec<u32>,
}

impl Direct {
    fn new(name: &'static str, registry: LockRegistry) -> Self {
        let (cycles, elapsed, cpu, latencies) = (0, Duration::ZERO, Duration::ZERO, Vec::new());
        Direct {
            name,
            registry,
            cycles,
            elapsed,
            cpu,
            latencies,
        }
    }

    async fn slice(&mut self, tasks: usize) {
        let (registry, name) = (self.registry.clone(), self.name);
        let cpu = cpu_time("self");
        let (cycles, elapsed, latencies) = measure(tasks, Duration::from_secs(1), move |i| {
            let registry = registry.clone();
            async move {
                let key = format!("{name}-{i}");
                let guard = registry.obtain(&key).expect("key");
                let guard = guard.try_lock().await.expect("free key");
                guard.release().await.expect("release");
            }
        })
        .await;
        self.cycles += cycles;
        self.elapsed += elapsed;
        self.latencies.extend(latencies);
        self.cpu += cpu_time("self").saturating_sub(cpu);
    }

    /// CPU microseconds of this process per cycle.
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.cycles.max(1) as f64
    }

    fn report(&mut self, out: &mut Map<String, Value>) {
        let rate = self.cycles as f64 / self.elapsed.as_secs_f64();
        let n = self.name;
        out.insert(format!("{n}_cycles_per_s"), json!(rate.round()));
        let cpu = (self.cpu_us() * 10.0).round() / 10.0;
        out.insert(format!("{n}_cpu_us_per_cycle"), json!(cpu));
        let p50 = quantile(&mut self.latencies, 0.5);
        out.insert(format!("{n}_p50_us"), json!(p50));
        let p99 = quantile(&mut self.latencies, 0.99);
        out.insert(format!("{n}_p99_us"), json!(p99));
    }
}

/// A server measured over HTTP.
struct Target {
    name: &'static str,
    pid: u32,
    /// The server process, when this program started it.
    child: Option<Child>,
    base: String,
    cycles: u64,
    elapsed: Duration,
    server_cpu: Duration,
    client_cpu: Duration,
    latencies: Vec<u32>,
    /// etcd's gateway: lock and unlock by etcd's own lock API instead of distlock's.
    gateway: bool,
}

impl Target {
    fn new(name: &'static str, (child, base): (Child, String)) -> Self {
        let mut target = Target::external(name, child.id(), base);
        target.child = Some(child);
        target
    }

    /// A server this program did not start (its process `pid` is only measured).
    fn external(name: &'static str, pid: u32, base: String) -> Self {
        Target {
            name,
            pid,
            child: None,
            base,
            cycles: 0,
            elapsed: Duration::ZERO,
            server_cpu: Duration::ZERO,
            client_cpu: Duration::ZERO,
            latencies: Vec::new(),
            gateway: false,
        }
    }

    /// One slice of POST + DELETE cycles.
    async fn slice(&mut self, client: &Client, tasks: usize) {
        let pid = self.pid.to_string();
        let (server, own) = (cpu_time(&pid), cpu_time("self"));
        let base = self.base.clone();
        let (cycles, elapsed, latencies) = match client {
            Client::Reqwest(http) if self.gateway => gateway_slice(http, &base, tasks).await,
            Client::Reqwest(http) => {
                let http = http.clone();
                measure(tasks, Duration::from_secs(1), move |i| {
                    let (http, url) = (http.clone(), format!("{base}/v1/locks/http-{i}"));
                    async move {
                        let r = http.post(&url).send().await.expect("POST");
                        assert_eq!(r.status(), 200, "POST {url}");
                        let granted: serde_json::Value = r.json().await.expect("JSON");
                        let token = granted["token"].as_str().expect("token");
                        let r = http
                            .delete(format!("{url}/{token}"))
                            .send()
                            .await
                            .expect("DELETE");
                        assert_eq!(r.status(), 204);
                    }
                })
                .await
            }
            Client::Raw => {
                let host = base.trim_start_matches("http://").to_owned();
                let conns: Arc<Vec<tokio::sync::Mutex<Option<RawConn>>>> =
                    Arc::new((0..tasks).map(|_| tokio::sync::Mutex::new(None)).collect());
                measure(tasks, Duration::from_secs(1), move |i| {
                    let (conns, host) = (conns.clone(), host.clone());
                    async move {
                        let mut slot = conns[i].lock().await;
                        if slot.is_none() {
                            *slot = Some(RawConn::connect(&host).await);
                        }
                        let conn = slot.as_mut().unwrap();
                        let path = format!("/v1/locks/http-{i}");
                        let (status, body) = conn.request("POST", &path).await;
                        assert_eq!(status, 200, "POST {path}: {body}");
                        let token = body
                            .split("\"token\":\"")
                            .nth(1)
                            .and_then(|t| t.split('"').next())
                            .expect("token")
                            .to_owned();
                        let (status, _) = conn.request("DELETE", &format!("{path}/{token}")).await;
                        assert_eq!(status, 204);
                    }
                })
                .await
            }
        };
        self.cycles += cycles;
        self.elapsed += elapsed;
        self.latencies.extend(latencies);
        self.server_cpu += cpu_time(&pid).saturating_sub(server);
        self.client_cpu += cpu_time("self").saturating_sub(own);
    }

    fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU microseconds per cycle.
    fn per_cycle(&self, cpu: Duration) -> f64 {
        (cpu.as_secs_f64() * 1e6 / self.cycles.max(1) as f64 * 10.0).round() / 10.0
    }

    fn stop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }
}

/// One slice of cycles on etcd's HTTP gateway, as its own lock API is used over HTTP: a lease
/// per task (granted once, long enough for the run), then `POST /v3/lock/lock` with the key's
/// name and the lease, and `POST /v3/lock/unlock` with the key it answered.
async fn gateway_slice(
    http: &reqwest::Client,
    base: &str,
    tasks: usize,
) -> (u64, Duration, Vec<u32>) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut leases = Vec::new();
    for _ in 0..tasks {
        let granted: Value = http
            .post(format!("{base}/v3/lease/grant"))
            .json(&json!({"TTL": 300}))
            .send()
            .await
            .expect("lease grant")
            .json()
            .await
            .expect("JSON");
        leases.push(granted["ID"].as_str().expect("lease ID").to_owned());
    }
    let leases = Arc::new(leases);
    let (http, base) = (http.clone(), base.to_owned());
    let answer = measure(tasks, Duration::from_secs(1), move |i| {
        let (http, base, leases) = (http.clone(), base.clone(), leases.clone());
        let name = b64.encode(format!("gateway-{i}"));
        async move {
            let locked: Value = http
                .post(format!("{base}/v3/lock/lock"))
                .json(&json!({"name": name, "lease": leases[i]}))
                .send()
                .await
                .expect("lock")
                .json()
                .await
                .expect("JSON");
            let key = locked["key"].as_str().expect("lock key");
            let r = http
                .post(format!("{base}/v3/lock/unlock"))
                .json(&json!({ "key": key }))
                .send()
                .await
                .expect("unlock");
            assert_eq!(r.status(), 200);
        }
    })
    .await;
    answer
}

/// The HTTP client of the slices.
enum Client {
    /// reqwest (hyper's client, a pool, JSON parsed with serde): what a Rust program would use.
    Reqwest(reqwest::Client),
    /// One keep-alive connection per task, requests written and answers read by hand: about
    /// the least CPU an HTTP/1.1 client can spend, so that on a small machine the client takes
    /// less of the CPU the server needs (as a client on another machine would).
    Raw,
}

/// A keep-alive HTTP/1.1 connection spoken by hand.
struct RawConn {
    stream: tokio::net::TcpStream,
    host: String,
    buf: Vec<u8>,
}

impl RawConn {
    async fn connect(host: &str) -> Self {
        let stream = tokio::net::TcpStream::connect(host).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        RawConn {
            stream,
            host: host.to_owned(),
            buf: Vec::with_capacity(1024),
        }
    }

    /// Sends a request without a body; the answer's status and body.
    async fn request(&mut self, method: &str, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: 0\r\n\r\n",
            self.host
        );
        self.stream.write_all(head.as_bytes()).await.expect("write");
        self.buf.clear();
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).expect("UTF-8 head");
                let status: u16 = head[9..12].parse().expect("status");
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let body_start = end + 4;
                while self.buf.len() < body_start + length {
                    let n = self.stream.read(&mut chunk).await.expect("read");
                    assert!(n > 0, "connection closed");
                    self.buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&self.buf[body_start..body_start + length]);
                return (status, body.into_owned());
            }
            let n = self.stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The service's resident memory (KiB) before and with `waiters` requests waiting for one
/// held key.
async fn waiting_memory(http: &reqwest::Client, service: &Target, waiters: usize) -> (u64, u64) {
    // One holder, then `waiters` requests that wait for the same key.
    let base = service.base.clone();
    let service_pid = service.pid;
    let held = http
        .post(format!("{base}/v1/locks/wait"))
        .json(&json!({"lease_ms": 300_000}))
        .send()
        .await
        .expect("hold");
    assert_eq!(held.status(), 200);
    let before = rss_kib(service_pid);
    let waiting: Vec<_> = (0..waiters)
        .map(|_| {
            let (http, url) = (http.clone(), format!("{base}/v1/locks/wait"));
            tokio::spawn(async move {
                let _ = http
                    .post(url)
                    .json(&json!({"wait_ms": 120_000}))
                    .send()
                    .await;
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list: serde_json::Value = http
            .get(format!("{base}/v1/locks"))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("JSON");
        if list["waiters"].as_array().map_or(0, Vec::len) >= waiters {
            break;
        }
        assert!(Instant::now() < deadline, "the waiters did not all arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let with_waiters = rss_kib(service_pid);
    for w in waiting {
        w.abort();
    }
    (before, with_waiters)
}

#[path = "http_bench/servers.rs"]
mod servers;
use servers::{null_axum, null_server};

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--null-axum") {
        null_axum();
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("--null-server") {
        let threads = std::env::args()
            .nth(2)
            .map_or(2, |t| t.parse().expect("threads"));
        null_server(threads);
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench(args()));
}

async fn bench(a: Args) {
    let prefix = format!("bench{}", std::process::id());

    let options = RegistryOptions::default()
        .with_prefix(prefix.clone())
        .with_renew(false)
        .with_max_local_handoffs(0);
    let registry = LockRegistry::connect(&a.backend, options.clone())
        .await
        .expect("backend");
    let service_backend = a.service_backend.as_deref().unwrap_or(&a.backend);
    let mut targets = vec![Target::new(
        "http",
        start_service(&a.distlock, service_backend, &prefix),
    )];
    if let Some(other) = &a.compare {
        let other_prefix = format!("{prefix}c");
        targets.push(Target::new(
            "compare",
            start_service(other, &a.backend, &other_prefix),
        ));
    }
    if a.ceiling {
        let mut command = Command::new(std::env::current_exe().expect("this program"));
        command.arg("--null-server");
        targets.push(Target::new("ceiling", start(command)));
    }
    if a.axum_ceiling {
        let mut command = Command::new(std::env::current_exe().expect("this program"));
        command.arg("--null-axum");
        targets.push(Target::new("axum_ceiling", start(command)));
    }
    if let Some(url) = &a.etcd_gateway {
        // The gateway is etcd itself: its process is the server measured.
        let pid = a.etcd_pid.expect("--etcd-gateway needs --etcd-pid");
        let mut gateway = Target::external("etcd_gateway", pid, url.trim_end_matches('/').into());
        gateway.gateway = true;
        targets.push(gateway);
    }
    if let Some(threads) = a.ceiling_threads {
        let mut command = Command::new(std::env::current_exe().expect("this program"));
        command.args(["--null-server", &threads.to_string()]);
        targets.push(Target::new("ceiling_threads", start(command)));
    }
    let http = reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(a.waiters + a.concurrency)
        .build()
        .expect("client");
    let client = match a.client.as_str() {
        "reqwest" => Client::Reqwest(http.clone()),
        "raw" => Client::Raw,
        other => panic!("--client reqwest or raw, not {other}"),
    };

    // The targets alternate in one-second slices, so that a change of load on the machine
    // falls on all alike.
    let mut direct = Direct::new("direct", registry);
    let mut direct2 = match &a.direct_backend2 {
        Some(url) => Some(Direct::new(
            "direct2",
            LockRegistry::connect(url, options.clone())
                .await
                .expect("second backend"),
        )),
        None => None,
    };
    for _ in 0..a.seconds {
        direct.slice(a.concurrency).await;
        if let Some(d) = &mut direct2 {
            d.slice(a.concurrency).await;
        }
        for target in &mut targets {
            target.slice(&client, a.concurrency).await;
        }
    }
    let direct_us = direct.cpu_us();
    let direct_rate = direct.cycles as f64 / direct.elapsed.as_secs_f64();

    let memory = if a.waiters > 0 {
        Some(waiting_memory(&http, &targets[0], a.waiters).await)
    } else {
        None
    };
    for target in &mut targets {
        target.stop();
    }

    let mut out = Map::new();
    out.insert("backend".into(), json!(distlock::redact(&a.backend)));
    if let Some(url) = &a.service_backend {
        out.insert("service_backend".into(), json!(distlock::redact(url)));
    }
    out.insert("concurrency".into(), json!(a.concurrency));
    out.insert("client".into(), json!(a.client));
    out.insert("seconds".into(), json!(a.seconds));
    direct.report(&mut out);
    if let Some(url) = &a.direct_backend2 {
        out.insert("direct2_backend".into(), json!(distlock::redact(url)));
        direct2.as_mut().unwrap().report(&mut out);
    }
    for t in &mut targets {
        out.insert(
            format!("{}_p50_us", t.name),
            json!(quantile(&mut t.latencies, 0.5)),
        );
        out.insert(
            format!("{}_p99_us", t.name),
            json!(quantile(&mut t.latencies, 0.99)),
        );
    }
    for t in &targets {
        let rate = t.rate();
        out.insert(format!("{}_cycles_per_s", t.name), json!(rate.round()));
        out.insert(
            format!("{}_ratio", t.name),
            json!(round2(rate / direct_rate)),
        );
        out.insert(
            format!("{}_server_cpu_us_per_cycle", t.name),
            json!(t.per_cycle(t.server_cpu)),
        );
        out.insert(
            format!("{}_client_cpu_us_per_cycle", t.name),
            json!(t.per_cycle(t.client_cpu)),
        );
    }
    // The service's own overhead: its CPU per cycle against what a do-nothing axum server
    // spends on the same two requests plus what the library spends on the cycle itself.
    if let Some(axum) = targets.iter().find(|t| t.name == "axum_ceiling") {
        let service = &targets[0];
        let floor = axum.per_cycle(axum.server_cpu) + direct_us;
        out.insert(
            "overhead_ratio".into(),
            json!(round2(service.per_cycle(service.server_cpu) / floor)),
        );
    }
    if let Some(gateway) = targets.iter().find(|t| t.gateway) {
        out.insert(
            "http_to_gateway_ratio".into(),
            json!(round2(targets[0].rate() / gateway.rate())),
        );
    }
    // The names of earlier runs.
    out.insert("ratio".into(), out["http_ratio"].clone());
    out.insert("waiters".into(), json!(a.waiters));
    if let Some((before, with_waiters)) = memory {
        out.insert("rss_before_kib".into(), json!(before));
        out.insert("rss_with_waiters_kib".into(), json!(with_waiters));
        out.insert(
            "extra_rss_mib".into(),
            json!(round2(with_waiters.saturating_sub(before) as f64 / 1024.0)),
        );
    }
    println!("{}", Value::Object(out));
}
