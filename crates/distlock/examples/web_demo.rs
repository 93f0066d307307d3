//! The articles' web demonstration with axum: `GET /lock?key=yeah` starts ten workers that
//! each take the lock `yeah` through the service's one registry and hold it for 3 s, so they
//! get it 3 s apart. The answer is their timeline, a line per acquisition as it happens (times
//! relative to the request), then a closing line with the shortest and longest gap.
//!
//! ```text
//! cargo run -p distlock --example web_demo [BACKEND_URL] [--listen ADDR]
//! curl -N 'http://127.0.0.1:8080/lock?key=yeah'      # optional: &workers=N&hold_ms=MS
//! cargo run -p distlock --example web_demo -- --self-test   # asks itself once and checks the answer
//! ```
//!
//! The workers of one registry wait for each other locally first (one of them contends with
//! other instances of the service at a time) and take the lock in arrival order.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::Router;
use distlock::{LockRegistry, RegistryOptions};
use serde::Deserialize;
use tokio::sync::mpsc;

#[derive(Deserialize)]
struct DemoQuery {
    key: String,
    workers: Option<usize>,
    hold_ms: Option<u64>,
}

/// One line of the answer per acquisition, as the workers get the lock, then the summary.
async fn demo(
    State(registry): State<LockRegistry>,
    Query(q): Query<DemoQuery>,
) -> Result<Body, String> {
    let asked = Instant::now();
    let lock = registry.obtain(&q.key).map_err(|e| e.to_string())?;
    let hold = Duration::from_millis(q.hold_ms.unwrap_or(3000).min(60_000));
    let workers = q.workers.unwrap_or(10).clamp(1, 100);
    let (lines, mut receiver) = mpsc::unbounded_channel::<String>();
    let (times, mut acquired) = mpsc::unbounded_channel::<Duration>();
    for worker in 1..=workers {
        let (lock, lines, times) = (lock.clone(), lines.clone(), times.clone());
        tokio::spawn(async move {
            match lock.lock().await {
                Ok(guard) => {
                    let at = asked.elapsed();
                    let _ = lines.send(format!(
                        "worker {worker} got lock {:?} at +{:.3}s, fence {}\n",
                        lock.key(),
                        at.as_secs_f64(),
                        guard.fence()
                    ));
                    let _ = times.send(at);
                    tokio::time::sleep(hold).await;
                    if let Err(e) = guard.release().await {
                        let _ = lines.send(format!("worker {worker}: {e}\n"));
                    }
                }
                Err(e) => {
                    let _ = lines.send(format!("worker {worker}: {e}\n"));
                }
            }
        });
    }
    drop((lines, times));
    // The closing line once every worker is done (their senders are gone).
    let key = q.key;
    let summary = async move {
        let mut all = Vec::new();
        while let Some(at) = acquired.recv().await {
            all.push(at);
        }
        all.sort();
        let gaps: Vec<Duration> = all.windows(2).map(|w| w[1] - w[0]).collect();
        match (gaps.iter().min(), gaps.iter().max()) {
            (Some(min), Some(max)) => format!(
                "{} acquisitions of lock {key:?}, one at a time; gaps: min {:.3}s, max {:.3}s (hold {:.3}s)\n",
                all.len(),
                min.as_secs_f64(),
                max.as_secs_f64(),
                hold.as_secs_f64()
            ),
            _ => format!("{} acquisition of lock {key:?}\n", all.len()),
        }
    };
    let timeline = futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx));
    let closing = futures_util::stream::once(summary);
    let answer = futures_util::StreamExt::map(
        futures_util::StreamExt::chain(timeline, closing),
        Ok::<_, Infallible>,
    );
    Ok(Body::from_stream(answer))
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
    let router = Router::new().route("/lock", get(demo)).with_state(registry);
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
    // apart, told in the answer.
    let (workers, hold) = (10usize, Duration::from_millis(300));
    let asked = Instant::now();
    let reply = get_once(
        addr,
        &format!(
            "/lock?key=yeah&workers={workers}&hold_ms={}",
            hold.as_millis()
        ),
    )
    .await?;
    let took = asked.elapsed();
    print!("{}", body_of(&reply));
    check(&reply, workers, hold, took)?;
    println!("self-test: the answer is the workers' timeline, one hold apart");
    Ok(())
}

/// The body of a whole HTTP/1.1 answer, chunks joined.
fn body_of(answer: &str) -> String {
    let Some((_, mut rest)) = answer.split_once("\r\n\r\n") else {
        return String::new();
    };
    let mut body = String::new();
    // Chunked: a hex size line, the chunk, CRLF; size 0 ends it.
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    body
}

/// The answer has one line per worker, times from the request on, increasing at least a hold
/// apart and within the time the request took, and the closing line.
fn check(
    answer: &str,
    workers: usize,
    hold: Duration,
    took: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let body = body_of(answer);
    let times: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("worker "))
        .map(|l| {
            let at = l.split(" at +").nth(1).and_then(|r| r.split('s').next());
            at.and_then(|t| t.parse().ok())
                .ok_or_else(|| format!("no time in {l:?}"))
        })
        .collect::<Result<_, _>>()?;
    if times.len() != workers {
        return Err(format!("{workers} acquisitions expected in {body:?}").into());
    }
    // Printed to the millisecond: a gap may read up to 1 ms short of the hold.
    let least = hold.as_secs_f64() - 0.001;
    if let Some(w) = times.windows(2).find(|w| w[1] - w[0] < least) {
        return Err(format!("two acquisitions less than a hold apart: {w:?} in {body:?}").into());
    }
    if times.last().is_some_and(|&t| t > took.as_secs_f64()) {
        return Err(format!("a time after the answer ended ({took:?}): {body:?}").into());
    }
    let last = body.lines().last().unwrap_or_default();
    if !last.starts_with(&format!(
        "{workers} acquisitions of lock \"yeah\", one at a time"
    )) {
        return Err(format!("no closing line in {body:?}").into());
    }
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
