//! The foreign client of the Redis backends: now and then it takes the workers' key the way
//! redis-py's `Lock` and most hand-written Redis locks do, `SET <key> <token> NX PX <lease>`
//! polled until it succeeds, and gives it back with a compare-and-delete script. It has no
//! fence, so it takes no part in the checker's writes; its holds and waits go into the
//! section log (role `foreign`), where they count for overlaps and liveness.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::checker::Checker;
use crate::proto::{now_ns, Request, Role, SectionId};
use crate::servers::{Servers, LOCK_KEY};

/// Compare-and-delete, as redis-py's `Lock.release` does it.
const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// How often it tries again while the key is busy (redis-py sleeps 100 ms by default; less
/// here, so that its own polling adds little to the stretches it waits).
const POLL: Duration = Duration::from_millis(20);

/// One connection to the server that holds the key now.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    /// Sends one command and returns the first line of its reply (enough for the replies of
    /// `SET` and of the script: `+OK`, `$-1`, `:1`, `:0`, `-ERR …`).
    async fn call(&mut self, args: &[&str]) -> io::Result<String> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.reader.get_mut().write_all(out.as_bytes()).await?;
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Err(io::Error::other("the server closed the connection"));
        }
        let line = line.trim_end().to_owned();
        if line.starts_with('-') {
            return Err(io::Error::other(line));
        }
        Ok(line)
    }
}

/// Contends for the key every 1–3 s, waiting at most `patience` each time, until aborted.
/// Its sections and waits are those of worker slot `slot`.
pub(crate) async fn run(
    checker: Checker,
    servers: Arc<Servers>,
    slot: usize,
    lease: Duration,
    patience: Duration,
) {
    let mut conn: Option<Conn> = None;
    let mut seq = 0;
    loop {
        let pause = Duration::from_millis(rand::rng().random_range(1000..=3000));
        tokio::time::sleep(pause).await;
        seq += 1;
        let id = SectionId {
            worker: slot,
            life: 0,
            seq,
        };
        let token = format!("foreign-{seq}-{:08x}", rand::random::<u32>());
        let lease_ms = lease.as_millis().to_string();
        let start = now_ns();
        checker.handle(Request::Waiting {
            id,
            t: start,
            role: Role::Foreign,
        });
        let give_up = start + u64::try_from(patience.as_nanos()).unwrap_or(u64::MAX);
        loop {
            if now_ns() > give_up {
                checker.handle(Request::Abandoned { id, t: now_ns() });
                break;
            }
            if conn.is_none() {
                conn = connect(&servers).await;
            }
            let Some(c) = conn.as_mut() else {
                tokio::time::sleep(POLL).await;
                continue;
            };
            match c
                .call(&["SET", LOCK_KEY, &token, "NX", "PX", &lease_ms])
                .await
            {
                Ok(reply) if reply == "+OK" => {
                    hold(&checker, id, c, &token).await;
                    break;
                }
                Ok(_) => tokio::time::sleep(POLL).await,
                Err(_) => {
                    // Restarted, failed over or moved: look the server up again.
                    conn = None;
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

async fn connect(servers: &Arc<Servers>) -> Option<Conn> {
    let servers = servers.clone();
    let addr = tokio::task::spawn_blocking(move || servers.foreign_target())
        .await
        .ok()?
        .ok()?;
    // In the run's log: which server it took the key on, to tell after a failover whether it
    // talked to the master everybody else did.
    eprintln!(
        "torture: foreign client connects to {addr} at {:.1} ms (CLOCK_MONOTONIC)",
        now_ns() as f64 / 1e6
    );
    Conn::open(addr).await.ok()
}

/// Holds the key for 20–100 ms (far below its `PX`, so that the hold never outlives the key)
/// and gives it back.
async fn hold(checker: &Checker, id: SectionId, conn: &mut Conn, token: &str) {
    checker.handle(Request::Acquired {
        id,
        fence: 0,
        t: now_ns(),
        role: Role::Foreign,
        busy_until: 0,
    });
    let work = Duration::from_millis(rand::rng().random_range(20..=100));
    tokio::time::sleep(work).await;
    checker.handle(Request::End {
        id,
        t: now_ns(),
        lost: None,
        wrote: false,
        held_after_write: false,
    });
    let _ = conn.call(&["EVAL", RELEASE, "1", LOCK_KEY, token]).await;
}
