//! `distlock elect` (run CMD while leading an election) and `distlock leader` (who leads).
//!
//! An election is the mutex of its name: `elect --name N` is `run --key N` with the candidate's
//! description as the owner and `DISTLOCK_TERM` beside `DISTLOCK_FENCE`, so it stops CMD on loss
//! by the same rules and exits with CMD's status.

use std::time::Duration;

use distlock::Leader;
use futures_util::StreamExt;
use serde::Serialize;

use crate::config::{Failure, Global};
use crate::signals::Signals;
use crate::status::EXIT_FREE;
use crate::util::out;

/// How often `leader --watch` asks who leads.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// `leader N [--json] [--watch]`: exit 0 while somebody leads, 3 when nobody does; with
/// `--watch`, a line per change until a signal (then 128 + the signal).
pub async fn leader(global: &Global, name: &str, json: bool, watch: bool) -> Result<i32, Failure> {
    let Some(registry) = global.registry_if_any().await? else {
        out(&line(name, None, json));
        if watch {
            return Err(Failure::usage(
                "leader --watch needs a backend: the default SQLite file does not exist yet",
            ));
        }
        return Ok(EXIT_FREE);
    };
    let election = registry.election(name)?;
    if !watch {
        let now = election.leader().await?;
        out(&line(name, now.as_ref(), json));
        return Ok(if now.is_some() { 0 } else { EXIT_FREE });
    }
    let mut signals = Signals::install();
    let mut changes = Box::pin(election.observe_every(WATCH_EVERY));
    loop {
        tokio::select! {
            sig = signals.recv() => return Ok(128 + sig),
            change = changes.next() => match change {
                Some(Ok(now)) => out(&line(name, now.as_ref(), json)),
                Some(Err(e)) => tracing::warn!(error = %e, "could not tell who leads"),
                None => return Ok(0),
            },
        }
    }
}

#[derive(Serialize)]
struct LeaderJson<'a> {
    name: &'a str,
    leader: Option<&'a str>,
    term: Option<u64>,
}

fn line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    if json {
        return serde_json::to_string(&LeaderJson {
            name,
            leader: leader.map(|l| l.description.as_str()),
            term: leader.map(|l| l.term),
        })
        .expect("plain fields serialize");
    }
    match leader {
        Some(l) => format!("{name:?}: led by {}, term {}", l.description, l.term),
        None => format!("{name:?}: no leader"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_leader_and_term() {
        let l = Leader {
            description: "web-1:7".into(),
            term: 2048,
        };
        assert_eq!(
            line("jobs", Some(&l), false),
            r#""jobs": led by web-1:7, term 2048"#
        );
        assert_eq!(line("jobs", None, false), r#""jobs": no leader"#);
        assert_eq!(
            line("jobs", Some(&l), true),
            r#"{"name":"jobs","leader":"web-1:7","term":2048}"#
        );
        assert_eq!(
            line("jobs", None, true),
            r#"{"name":"jobs","leader":null,"term":null}"#
        );
    }
}
