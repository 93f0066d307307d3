//! A TCP proxy that injects network faults between a client and a server.
//!
//! Point a client at [`FaultProxy::addr`] instead of the server, then break the network under it
//! on demand: [`cut`](FaultProxy::cut) the connections, [`pause`](FaultProxy::pause) the bytes
//! (a partition), or [`delay`](FaultProxy::set_delay) them.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Size of the buffer each direction of a connection reads into; one read is one "chunk".
const CHUNK: usize = 16 * 1024;

/// The faults in force, shared with every connection task through a watch channel.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// Bumped by every [`FaultProxy::cut`]. A connection accepted under an older epoch is closed,
    /// so even a `cut` immediately followed by `restore` kills every connection it saw.
    epoch: u64,
    /// New connections are refused while set.
    cut: bool,
    /// Bytes are held (neither read nor written) while set.
    paused: bool,
    /// Sleep before each forwarded chunk.
    delay: Duration,
}

/// A loopback TCP proxy to one target address that can cut, pause or delay the traffic.
///
/// Every accepted connection gets its own connection to the target (made when the client
/// connects, or once a [`pause`](Self::pause) ends); bytes are copied both ways, half-closes are
/// forwarded. The fault controls take effect before they return: no byte is forwarded on a cut
/// connection, nor while paused, after the call.
///
/// Dropping the proxy stops its listener and closes every connection it carries (the tasks are
/// aborted, which takes effect at the runtime's next turn). It must be created inside a Tokio
/// runtime, which must keep running for the proxy to forward anything.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use distlock_testkit::{proxy::FaultProxy, redis::RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr()).await?;
/// let url = format!("redis://{}", proxy.addr()); // give this to the client under test
/// proxy.cut(); // every connection is reset, new ones are refused
/// proxy.restore();
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    faults: watch::Sender<Faults>,
    live: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free `127.0.0.1` port that forwards to `target`.
    ///
    /// The target need not be up yet: while it refuses connections, clients of the proxy are
    /// reset as soon as they connect, as if the server were down.
    ///
    /// # Errors
    ///
    /// Fails if no loopback port can be bound.
    ///
    /// # Panics
    ///
    /// Panics if called outside a Tokio runtime.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (faults, watcher) = watch::channel(Faults::default());
        let live = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(listener, target, watcher, Arc::clone(&live)));
        Ok(FaultProxy {
            addr,
            target,
            faults,
            live,
            task,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Closes every live connection with a reset (both the client's and the proxy's own to the
    /// target) and refuses new ones until [`restore`](Self::restore): a new client connection is
    /// reset as soon as it is accepted, so its first read or write fails.
    pub fn cut(&self) {
        self.faults.send_modify(|faults| {
            faults.cut = true;
            faults.epoch += 1;
        });
    }

    /// Accepts and forwards new connections again after a [`cut`](Self::cut). Connections that
    /// were cut stay closed; clients must reconnect.
    pub fn restore(&self) {
        self.faults.send_modify(|faults| faults.cut = false);
    }

    /// Whether the proxy is cut (refusing connections).
    pub fn is_cut(&self) -> bool {
        self.faults.borrow().cut
    }

    /// Delays each forwarded chunk (one read from either side, up to 16 KiB) by `delay`, in both
    /// directions; a request and its reply pay it twice. `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        self.faults.send_modify(|faults| faults.delay = delay);
    }

    /// Stops forwarding bytes without closing anything, like a network partition: connections
    /// stay open, bytes already read are held, senders block once the socket buffers fill,
    /// and new connections are accepted but not connected to the target. [`resume`](Self::resume)
    /// delivers everything held.
    pub fn pause(&self) {
        self.faults.send_modify(|faults| faults.paused = true);
    }

    /// Forwards again after a [`pause`](Self::pause), including the bytes held meanwhile.
    pub fn resume(&self) {
        self.faults.send_modify(|faults| faults.paused = false);
    }

    /// Whether the proxy is paused.
    pub fn is_paused(&self) -> bool {
        self.faults.borrow().paused
    }

    /// How many client connections the proxy is currently serving.
    pub fn live_connections(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    /// Aborts the listener task, which aborts every connection task and so closes every socket.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts clients and spawns one task per connection; the tasks die with this one.
async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    faults: watch::Receiver<Faults>,
    live: Arc<AtomicUsize>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let client = match accepted {
                    Ok((client, _)) => client,
                    Err(_) => {
                        // Out of file descriptors or a similar transient failure: back off.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let now = *faults.borrow();
                if now.cut {
                    reset(&client);
                    continue;
                }
                connections.spawn(serve(
                    client,
                    target,
                    faults.clone(),
                    now.epoch,
                    Arc::clone(&live),
                ));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as live for as long as it exists.
struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    fn new(live: Arc<AtomicUsize>) -> LiveGuard {
        live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(live)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one client accepted under `epoch`: connects to the target and copies both ways.
async fn serve(
    client: TcpStream,
    target: SocketAddr,
    mut faults: watch::Receiver<Faults>,
    epoch: u64,
    live: Arc<AtomicUsize>,
) {
    let _live = LiveGuard::new(live);
    // During a partition the target is unreachable: wait before connecting to it.
    if ready(&mut faults, epoch).await.is_err() {
        reset(&client);
        return;
    }
    let upstream = tokio::select! {
        biased;
        _ = cut(&mut faults, epoch) => None,
        connected = TcpStream::connect(target) => connected.ok(),
    };
    let Some(upstream) = upstream else {
        // Cut meanwhile, or the target is down: the client sees its connection reset.
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let (mut client_read, mut client_write) = client.into_split();
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let copied = tokio::try_join!(
        pump(&mut client_read, &mut upstream_write, faults.clone(), epoch),
        pump(&mut upstream_read, &mut client_write, faults, epoch),
    );
    if copied.is_err() {
        // A cut, or one side failed: reset both so each peer learns at once.
        reset(client_read.as_ref());
        reset(upstream_read.as_ref());
    }
    // Dropping the halves closes both sockets.
}

/// Copies `from` to `to` chunk by chunk, obeying the faults; forwards EOF as a half-close.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut faults: watch::Receiver<Faults>,
    epoch: u64,
) -> io::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        let read = loop {
            ready(&mut faults, epoch).await?;
            tokio::select! {
                biased;
                interrupted = paused_or_cut(&mut faults, epoch) => interrupted?,
                read = from.read(&mut buf) => break read?,
            }
        };
        if read == 0 {
            return to.shutdown().await;
        }
        let delay = faults.borrow().delay;
        if !delay.is_zero() {
            tokio::select! {
                biased;
                error = cut(&mut faults, epoch) => return Err(error),
                () = tokio::time::sleep(delay) => {}
            }
        }
        // Hold what was read while paused; drop it if cut meanwhile.
        ready(&mut faults, epoch).await?;
        tokio::select! {
            biased;
            error = cut(&mut faults, epoch) => return Err(error),
            written = to.write_all(&buf[..read]) => written?,
        }
    }
}

fn cut_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "cut by FaultProxy")
}

/// Fails if the connection of `epoch` was cut.
fn check(faults: &Faults, epoch: u64) -> io::Result<()> {
    if faults.epoch == epoch {
        Ok(())
    } else {
        Err(cut_error())
    }
}

/// Returns once forwarding may go on: at once unless paused. Fails if cut.
async fn ready(faults: &mut watch::Receiver<Faults>, epoch: u64) -> io::Result<()> {
    loop {
        let now = *faults.borrow_and_update();
        check(&now, epoch)?;
        if !now.paused {
            return Ok(());
        }
        faults.changed().await.map_err(|_| cut_error())?;
    }
}

/// Returns when a pause starts, fails when a cut happens; waits for changes after the last seen.
async fn paused_or_cut(faults: &mut watch::Receiver<Faults>, epoch: u64) -> io::Result<()> {
    loop {
        faults.changed().await.map_err(|_| cut_error())?;
        let now = *faults.borrow_and_update();
        check(&now, epoch)?;
        if now.paused {
            return Ok(());
        }
    }
}

/// Resolves with an error once the connection of `epoch` is cut (or the proxy is gone).
async fn cut(faults: &mut watch::Receiver<Faults>, epoch: u64) -> io::Error {
    loop {
        if faults.changed().await.is_err() {
            return cut_error();
        }
        if let Err(error) = check(&faults.borrow_and_update(), epoch) {
            return error;
        }
    }
}

/// Makes the socket send a reset instead of a FIN when it is closed, as a broken network does.
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the descriptor belongs to `stream`, which is alive for the call; the option value
    // points to a `linger` of the length passed. A failure only means a FIN instead of a reset.
    // (Tokio's `set_linger` is deprecated, and `set_zero_linger` is newer than our minimum Tokio.)
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::linger>()).unwrap_or(8),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::time::timeout;

    use super::*;
    use crate::free_port;

    /// A server that echoes every byte back and half-closes when its client does.
    async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut sessions = JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                sessions.spawn(async move {
                    let (mut read, mut write) = stream.split();
                    if tokio::io::copy(&mut read, &mut write).await.is_ok() {
                        let _ = write.shutdown().await;
                    }
                });
            }
        });
        (addr, task)
    }

    async fn round_trip(stream: &mut TcpStream, message: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(message).await?;
        let mut reply = vec![0; message.len()];
        timeout(Duration::from_secs(5), stream.read_exact(&mut reply))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no echo within 5 s"))??;
        Ok(reply)
    }

    /// Whether the connection is closed (EOF or error) as seen within two seconds.
    async fn is_closed(stream: &mut TcpStream) -> bool {
        let _ = stream.write_all(b"?").await;
        let mut buf = [0; 64];
        matches!(
            timeout(Duration::from_secs(2), stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    /// Whether nothing arrives within `wait`, the connection staying open.
    async fn is_silent(stream: &mut TcpStream, wait: Duration) -> bool {
        let mut buf = [0; 64];
        timeout(wait, stream.read(&mut buf)).await.is_err()
    }

    async fn wait_for_live(proxy: &FaultProxy, expected: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while proxy.live_connections() != expected {
            assert!(
                Instant::now() < deadline,
                "live connections stayed {} instead of {expected}",
                proxy.live_connections()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn proxy_forwards_bytes_both_ways() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        assert_eq!(proxy.target(), echo);
        assert_ne!(proxy.addr(), echo);
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut client, b"hello").await.unwrap(), b"hello");
        wait_for_live(&proxy, 1).await;

        // Larger than any socket buffer, written and read concurrently.
        let payload: Vec<u8> = (0..4 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let (mut read, mut write) = client.split();
        let (written, echoed) = tokio::join!(write.write_all(&payload), async {
            let mut echoed = vec![0; payload.len()];
            read.read_exact(&mut echoed).await.map(|_| echoed)
        });
        written.unwrap();
        assert!(echoed.unwrap() == payload);
    }

    #[tokio::test]
    async fn half_close_is_forwarded() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"last words").await.unwrap();
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rest, b"last words");
        wait_for_live(&proxy, 0).await;
    }

    #[tokio::test]
    async fn cut_closes_live_connections_and_refuses_new_ones_until_restored() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut before = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut before, b"ping").await.unwrap();

        proxy.cut();
        assert!(proxy.is_cut());
        assert!(
            is_closed(&mut before).await,
            "a live connection is closed by cut"
        );
        wait_for_live(&proxy, 0).await;
        if let Ok(mut during) = TcpStream::connect(proxy.addr()).await {
            assert!(is_closed(&mut during).await, "cut refuses new clients");
        }

        proxy.restore();
        assert!(!proxy.is_cut());
        let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut after, b"pong").await.unwrap(), b"pong");
    }

    #[tokio::test]
    async fn cut_then_restore_at_once_still_kills_old_connections() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut before = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut before, b"ping").await.unwrap();
        proxy.cut();
        proxy.restore();
        assert!(is_closed(&mut before).await);
        let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut after, b"ping").await.unwrap();
    }

    #[tokio::test]
    async fn pause_holds_bytes_without_closing_until_resume() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"warm-up").await.unwrap();

        proxy.pause();
        assert!(proxy.is_paused());
        client.write_all(b"held").await.unwrap();
        assert!(is_silent(&mut client, Duration::from_millis(300)).await);
        // A client connecting during the partition is accepted but not served.
        let mut newcomer = TcpStream::connect(proxy.addr()).await.unwrap();
        newcomer.write_all(b"queued").await.unwrap();
        assert!(is_silent(&mut newcomer, Duration::from_millis(100)).await);

        proxy.resume();
        assert!(!proxy.is_paused());
        let mut held = [0; 4];
        timeout(Duration::from_secs(5), client.read_exact(&mut held))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&held, b"held");
        let mut queued = [0; 6];
        timeout(Duration::from_secs(5), newcomer.read_exact(&mut queued))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&queued, b"queued");
    }

    #[tokio::test]
    async fn cut_during_pause_closes_the_held_connections() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"x").await.unwrap();
        proxy.pause();
        client.write_all(b"held").await.unwrap();
        proxy.cut();
        assert!(is_closed(&mut client).await);
        proxy.resume();
        proxy.restore();
        let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut after, b"ok").await.unwrap();
    }

    #[tokio::test]
    async fn delay_applies_to_each_forwarded_chunk() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"warm-up").await.unwrap();

        proxy.set_delay(Duration::from_millis(500));
        let started = Instant::now();
        round_trip(&mut client, b"slow").await.unwrap();
        // There and back: two chunks, each delayed.
        assert!(started.elapsed() >= Duration::from_secs(1));

        // Without the delay a round trip takes no delayed chunk at all: well under the 1 s that
        // two delayed chunks would take, even on a loaded machine.
        proxy.set_delay(Duration::ZERO);
        let started = Instant::now();
        round_trip(&mut client, b"fast").await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn drop_closes_connections_and_the_listener() {
        let (echo, _server) = echo_server().await;
        let proxy = FaultProxy::start(echo).await.unwrap();
        let addr = proxy.addr();
        let mut client = TcpStream::connect(addr).await.unwrap();
        round_trip(&mut client, b"ping").await.unwrap();
        drop(proxy);
        assert!(is_closed(&mut client).await);
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn target_down_resets_clients() {
        let nowhere = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let proxy = FaultProxy::start(nowhere).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(is_closed(&mut client).await);
    }

    async fn ping(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
        stream.write_all(b"PING\r\n").await?;
        let mut reply = vec![0; b"+PONG\r\n".len()];
        timeout(Duration::from_secs(5), stream.read_exact(&mut reply))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no PONG within 5 s"))??;
        Ok(reply)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn proxy_in_front_of_a_redis_server_survives_its_restart() {
        let mut server = crate::redis::RedisServer::start().unwrap();
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(ping(&mut client).await.unwrap(), b"+PONG\r\n");

        proxy.cut();
        assert!(is_closed(&mut client).await);
        proxy.restore();

        server.restart().unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(ping(&mut client).await.unwrap(), b"+PONG\r\n");
        server.kill();
        assert!(is_closed(&mut client).await);
    }
}
