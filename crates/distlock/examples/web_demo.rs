//! The articles' web demonstration with axum: `GET /lock?key=yeah` starts ten workers that
//! each take the lock `yeah` through the service's one registry, hold it for 3 s and log the
//! time they got it, so the log lines come out 3 s apart; the request answers `OK` at once.
//!
//! ```text
//! cargo run -p distlock --example web_demo [BACKEND_URL] [--listen ADDR]
//! curl 'http://127.0.0.1:8080/lock?key=yeah'        # optional: &workers=N&hold_ms=MS
//! cargo run -p distlock --example web_demo -- --self-test   # asks itself once and checks the gaps
//! ```
//!
//! The workers of one registry wait for each other locally first (one of them contends with
//! other instances of the service at a time) and take the lock in arrival order.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use distlock::{LockRegistry, RegistryOptions};
use serde::Deserialize;

#[derive(Deserialize)]
struct DemoQuery {
    key: String,
    workers: Option<usize>,
    hold_ms: Option<u64>,
}

#[derive(Clone)]
struct App {
    registry: LockRegistry,
    started: Instant,
    /// When each worker got the lock, for the self-test.
    acquired: Arc<Mutex<Vec<Duration>>>,
}

async fn demo(State(app): State<App>, Query(q): Query<DemoQuery>) -> Result<&'static str, String> {
    let lock = app.registry.obtain(&q.key).map_err(|e| e.to_string())?;
    let hold = Duration::from_millis(q.hold_ms.unwrap_or(3000).min(60_000));
    for worker in 1..=q.workers.unwrap_or(10).min(100) {
        let (lock, app) = (lock.clone(), app.clone());
        tokio::spawn(async move {
            match lock.lock().await {
                Ok(guard) => {
                    let at = app.started.elapsed();
                    println!(
                        "worker {worker} got lock {:?} at +{:.3}s, fence {}",
                        lock.key(),
                        at.as_secs_f64(),
                        guard.fence()
                    );
                    app.acquired.lock().unwrap().push(at);
                    tokio::time::sleep(hold).await;
                    if let Err(e) = guard.release().await {
                        eprintln!("worker {worker}: {e}");
                    }
                }
                Err(e) => eprintln!("worker {worker}: {e}"),
            }
        });
    }
    Ok("OK")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let self_test = args.iter().any(|a| a == "--self-test");
    let listen = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| {
            if self_test {
                "127.0.0.1:0"
            } else {
                "127.0.0.1:8080"
            }
            .to_owned()
        });
    let url = args
        .iter()
        .find(|a| a.contains("://"))
        .cloned()
        .unwrap_or_else(|| "memory://".into());
    let registry = LockRegistry::connect(&url, RegistryOptions::default()).await?;
    let app = App {
        registry,
        started: Instant::now(),
        acquired: Arc::new(Mutex::new(Vec::new())),
    };
    let router = Router::new()
        .route("/lock", get(demo))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    let addr = listener.local_addr()?;
    println!(
        "listening on http://{addr}/lock?key=yeah ({})",
        distlock::redact(&url)
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    if !self_test {
        server.await??;
        return Ok(());
    }
    // Ask once, as curl would, then check what the articles show: ten acquisitions, one hold
    // apart.
    let (workers, hold) = (10usize, Duration::from_millis(300));
    let reply = get_once(
        addr,
        &format!(
            "/lock?key=yeah&workers={workers}&hold_ms={}",
            hold.as_millis()
        ),
    )
    .await?;
    assert!(
        reply.ends_with("OK"),
        "the demo answers OK at once: {reply:?}"
    );
    let deadline = Instant::now() + hold * (workers as u32) * 20;
    while app.acquired.lock().unwrap().len() < workers {
        assert!(
            Instant::now() < deadline,
            "the workers did not all get the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let times = app.acquired.lock().unwrap().clone();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let shortest = gaps.iter().min().copied().unwrap_or_default();
    assert!(
        shortest >= hold - Duration::from_millis(5),
        "two workers held the lock less than a hold apart: {gaps:?}"
    );
    println!(
        "{workers} acquisitions one after another; gaps between them at least {:?} (hold {hold:?})",
        shortest
    );
    Ok(())
}

/// One HTTP/1.1 GET over a fresh connection; the whole answer.
async fn get_once(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}
