//! Termination signals received as events, so that distlock can release its locks first.

use std::task::Poll;

use nix::sys::signal::Signal as Sig;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGINT, SIGTERM and SIGHUP, received as events instead of ending the process.
pub struct Signals {
    streams: Vec<(i32, Signal)>,
}

impl Signals {
    pub fn install() -> Self {
        let mut streams = Vec::new();
        for (kind, number) in [
            (SignalKind::interrupt(), Sig::SIGINT as i32),
            (SignalKind::terminate(), Sig::SIGTERM as i32),
            (SignalKind::hangup(), Sig::SIGHUP as i32),
        ] {
            match signal(kind) {
                Ok(s) => streams.push((number, s)),
                Err(e) => tracing::debug!(signal = number, error = %e, "cannot handle signal"),
            }
        }
        Signals { streams }
    }

    /// The next signal's number. Cancel safe.
    pub async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*number);
                }
            }
            Poll::Pending
        })
        .await
    }
}
