//! The attempt loop every member of the family runs: look at the queue (create or find the own
//! entry, read the entries before it, judge), then hold, leave (a try that finds the lock busy),
//! refuse (a permit of another number of permits) or wait for what keeps it out; looking again
//! when the queue changed under it. A member writes one [`Round`]: its I/O for each step.

use std::future::Future;

use crate::backend::Attempt;
use crate::error::{Error, Result};

/// What one look at the queue found for a contender's entry.
pub(crate) enum Look<W> {
    /// The queue changed under the look (the own entry went, a session vanished): look again.
    Again,
    /// Nothing before it keeps it out: it holds, with this fence.
    Holds(u64),
    /// It waits for `W`, with this many contenders ahead when known.
    Waits(W, Option<u32>),
    /// A permit before it belongs to a semaphore with this other number of permits.
    Disagrees(u32),
}

/// One member's steps of an attempt by one contender.
pub(crate) trait Round: Send {
    /// What a waiter waits for (a predecessor, a folder of permits).
    type Wait: Send;

    /// Creates the own entry or finds it, reads the queue and judges the entry's place.
    fn look(&mut self) -> impl Future<Output = Result<Look<Self::Wait>>> + Send;

    /// Makes the entry a holder's (clears what marked it a waiter's, moves it to the lease's
    /// session) and records the hold; `false` when the entry went meanwhile: look again.
    fn hold(&mut self) -> impl Future<Output = Result<bool>> + Send;

    /// A try that found the lock busy: the entry leaves the queue.
    fn leave(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// The entry leaves the queue, refused: a permit before it has `other` permits.
    fn refuse(&mut self, other: u32) -> impl Future<Output = Error> + Send;

    /// A queued entry waits for `what`: arranges the wake-up. `true` when the waiter is woken
    /// in turn (the attempt answers busy), `false` when what it waits for changed: look again.
    fn wait(
        &mut self,
        what: Self::Wait,
        ahead: Option<u32>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The answer when `rounds` looks in a row found the queue changing.
    fn unsettled(&self) -> Result<Attempt>;
}

/// One attempt of `round`'s contender, at most `rounds` looks; a `queued` one stays in the
/// queue when the lock is busy.
pub(crate) async fn attempt<R: Round>(
    round: &mut R,
    queued: bool,
    rounds: usize,
) -> Result<Attempt> {
    for _ in 0..rounds {
        match round.look().await? {
            Look::Again => {}
            Look::Holds(fence) => {
                if round.hold().await? {
                    return Ok(Attempt::Acquired { fence });
                }
            }
            Look::Disagrees(other) => return Err(round.refuse(other).await),
            Look::Waits(_, _) if !queued => {
                round.leave().await?;
                return Ok(Attempt::BUSY);
            }
            Look::Waits(what, ahead) => {
                if round.wait(what, ahead).await? {
                    return Ok(Attempt::Busy {
                        retry_after: None,
                        ahead,
                    });
                }
            }
        }
    }
    round.unsettled()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A scripted round: its looks in order, and what hold and wait answer.
    struct Script {
        looks: VecDeque<Look<&'static str>>,
        hold: VecDeque<bool>,
        wait: VecDeque<bool>,
        log: Vec<String>,
    }

    fn script(looks: Vec<Look<&'static str>>, hold: Vec<bool>, wait: Vec<bool>) -> Script {
        Script {
            looks: looks.into(),
            hold: hold.into(),
            wait: wait.into(),
            log: Vec::new(),
        }
    }

    impl Round for Script {
        type Wait = &'static str;
        async fn look(&mut self) -> Result<Look<&'static str>> {
            self.log.push("look".into());
            Ok(self.looks.pop_front().unwrap_or(Look::Again))
        }
        async fn hold(&mut self) -> Result<bool> {
            self.log.push("hold".into());
            Ok(self.hold.pop_front().unwrap_or(true))
        }
        async fn leave(&mut self) -> Result<()> {
            self.log.push("leave".into());
            Ok(())
        }
        async fn refuse(&mut self, other: u32) -> Error {
            self.log.push(format!("refuse {other}"));
            Error::config("refused")
        }
        async fn wait(&mut self, what: &'static str, _ahead: Option<u32>) -> Result<bool> {
            self.log.push(format!("wait {what}"));
            Ok(self.wait.pop_front().unwrap_or(true))
        }
        fn unsettled(&self) -> Result<Attempt> {
            Ok(Attempt::BUSY)
        }
    }

    async fn run(s: &mut Script, queued: bool) -> Result<Attempt> {
        attempt(s, queued, 3).await
    }

    #[tokio::test]
    async fn holds_leaves_waits_and_looks_again_as_the_round_says() {
        let (again, holds) = (Look::Again, Look::Holds(7));
        let mut s = script(
            vec![again, holds, Look::Holds(7)],
            vec![false, true],
            vec![],
        );
        let got = run(&mut s, true).await.unwrap();
        assert!(matches!(got, Attempt::Acquired { fence: 7 }), "{got:?}");
        assert_eq!(s.log, ["look", "look", "hold", "look", "hold"]);

        // Three looks that find the queue changing are the bound.
        let mut s = script(
            vec![Look::Holds(7), Look::Holds(7)],
            vec![false, false],
            vec![],
        );
        assert_eq!(run(&mut s, true).await.unwrap(), Attempt::BUSY);
        assert_eq!(s.log, ["look", "hold", "look", "hold", "look"]);

        let mut s = script(vec![Look::Waits("p", Some(2))], vec![], vec![]);
        assert!(matches!(
            run(&mut s, false).await.unwrap(),
            Attempt::Busy { ahead: None, .. }
        ));
        assert_eq!(s.log, ["look", "leave"]);

        let mut s = script(
            vec![Look::Waits("p", Some(2)), Look::Waits("q", Some(1))],
            vec![],
            vec![false, true],
        );
        let got = run(&mut s, true).await.unwrap();
        assert!(
            matches!(got, Attempt::Busy { ahead: Some(1), .. }),
            "{got:?}"
        );
        assert_eq!(s.log, ["look", "wait p", "look", "wait q"]);

        let mut s = script(vec![Look::Disagrees(3)], vec![], vec![]);
        assert!(run(&mut s, true).await.is_err());
        assert_eq!(s.log, ["look", "refuse 3"]);
    }
}
