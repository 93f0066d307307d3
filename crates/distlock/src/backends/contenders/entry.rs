//! One contender's life as this process knows it ([`Contender`]: queued, held until a deadline,
//! to be deleted), around the member's own handle on its entry; and the reaper's decision on it
//! ([`Contender::fate`]), under the member's timing [`Rules`].

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use tokio::time::Instant;

/// Where a contender's entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Stage {
    /// Nothing on the server (or not known yet: `maybe_created`).
    #[default]
    New,
    /// The entry is queued behind others.
    Queued,
    /// The entry holds.
    Held,
    /// The entry must be deleted; a deletion failed and is retried.
    Zombie,
    /// Nothing left on the server.
    Done,
}

/// A member's timing rules for the reaper; `None`: a rule it does not apply (the default applies
/// none: only holds end).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rules {
    /// How long after the registry's last call an unsubscribed waiter counts as gone.
    pub(crate) idle: Option<Duration>,
    /// How long after a failed attempt nobody came back to its entry counts as orphaned.
    pub(crate) orphan_grace: Option<Duration>,
}

/// What the reaper does with a contender (see [`Contender::fate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Delete its entry, then forget it.
    Delete,
    /// Forget it: nothing of it is on the server and nobody used it for a while.
    Forget,
    /// Look at it again then; never when `None` (a subscribed waiter, looked at again when
    /// the subscription is dropped; a zombie, whose deletion is retried on its own).
    Keep(Option<Instant>),
}

/// One contender of this process (one acquisition, by owner token): its life, and the
/// member's handle `H` on its entry (ZooKeeper's nodes, etcd's key), reached through `Deref`.
#[derive(Default)]
pub(crate) struct Contender<H> {
    pub(crate) stage: Stage,
    /// While held: when the registry's lease ends without renewal.
    pub(crate) deadline: Option<Instant>,
    /// The registry's last call for it.
    pub(crate) touched: Option<Instant>,
    /// A create was sent without an answer: the entry may exist.
    pub(crate) maybe_created: bool,
    /// The last attempt failed: the registry may not know that the entry is queued.
    pub(crate) failed_at: Option<Instant>,
    pub(crate) own: H,
}

impl<H> Contender<H> {
    /// A contender the registry calls for now, nothing of it on the server yet.
    pub(crate) fn new(own: H) -> Self {
        Contender {
            stage: Stage::New,
            deadline: None,
            touched: Some(Instant::now()),
            maybe_created: false,
            failed_at: None,
            own,
        }
    }

    /// Whether it holds (until [`deadline`](Self::deadline) unless renewed).
    pub(crate) fn held(&self) -> bool {
        self.stage == Stage::Held
    }

    /// It holds until `deadline` unless renewed.
    pub(crate) fn hold(&mut self, deadline: Instant) {
        self.stage = Stage::Held;
        self.deadline = Some(deadline);
    }

    /// What the reaper does with it at `now`, its waiter `subscribed` or not: delete the entry
    /// of a hold whose lease ended unrenewed, of an unsubscribed waiter idle for `rules.idle`,
    /// of a failed attempt nobody came back to within `rules.orphan_grace` (the registry may
    /// have given up without knowing the entry was queued), of a create whose answer was lost
    /// once idle; forget an idle contender with nothing on the server.
    pub(crate) fn fate(&self, rules: &Rules, subscribed: bool, now: Instant) -> Fate {
        let (idle_at, idle) = match rules.idle {
            Some(i) => {
                let at = self.touched.map(|t| t + i);
                (at, at.is_none_or(|t| t <= now))
            }
            None => (None, false),
        };
        let orphan_at = rules.orphan_grace.and_then(|grace| {
            let failed = self.failed_at?;
            self.touched
                .is_none_or(|t| t <= failed)
                .then(|| failed + grace)
        });
        let unclaimed = (self.stage == Stage::Queued || self.maybe_created) && !subscribed;
        let orphan_next = match orphan_at.filter(|_| unclaimed && !self.held()) {
            Some(t) if t <= now => return Fate::Delete,
            _ => orphan_at.filter(|t| unclaimed && *t > now),
        };
        let next = match self.stage {
            Stage::Held => match self.deadline {
                Some(d) if d <= now => return Fate::Delete,
                d => d,
            },
            Stage::Queued if !subscribed && idle => return Fate::Delete,
            Stage::Queued if !subscribed => idle_at,
            Stage::New if self.maybe_created && idle => return Fate::Delete,
            Stage::New | Stage::Done if !subscribed && idle => return Fate::Forget,
            Stage::New | Stage::Done if !subscribed => idle_at,
            _ => None,
        };
        Fate::Keep([orphan_next, next].into_iter().flatten().min())
    }
}

impl<H> Deref for Contender<H> {
    type Target = H;
    fn deref(&self) -> &H {
        &self.own
    }
}
impl<H> DerefMut for Contender<H> {
    fn deref_mut(&mut self) -> &mut H {
        &mut self.own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    /// etcd's rules, scaled: idle after 10 s, orphaned 3 s after a failure.
    const TIMED: Rules = Rules {
        idle: Some(Duration::from_secs(10)),
        orphan_grace: Some(Duration::from_secs(3)),
    };

    /// One case: the contender (stage, deadline, touched, failed at, maybe created, in seconds
    /// from t0), the rules, subscribed, now, and the fate expected (`Keep` in seconds).
    type Case = (
        Stage,
        Option<u64>,
        Option<u64>,
        Option<u64>,
        bool,
        Rules,
        bool,
        u64,
        Result<Option<u64>, Fate>,
    );

    #[test]
    fn the_fate_of_every_stage() {
        use Stage::*;
        let (keep, delete, forget) = (Ok, Err(Fate::Delete), Err(Fate::Forget));
        // ZooKeeper's rules: only a hold's deadline.
        let holds = Rules::default();
        #[rustfmt::skip]
        let cases: [Case; 22] = [
            // A hold goes when its lease ends unrenewed, subscribed or not, under both rules.
            (Held, Some(2), Some(0), None, false, TIMED, false, 0, keep(Some(2))),
            (Held, Some(2), Some(0), None, false, TIMED, true, 2, delete),
            (Held, Some(2), None, None, false, holds, false, 1, keep(Some(2))),
            (Held, Some(2), None, None, false, holds, false, 2, delete),
            // A hold is never an orphan, whatever an earlier attempt left unsure.
            (Held, Some(9), Some(0), Some(0), true, TIMED, false, 5, keep(Some(9))),
            // A waiter goes once unsubscribed and idle.
            (Queued, None, Some(0), None, false, TIMED, true, 10, keep(None)),
            (Queued, None, Some(0), None, false, TIMED, false, 0, keep(Some(10))),
            (Queued, None, Some(0), None, false, TIMED, false, 10, delete),
            (Queued, None, None, None, false, TIMED, false, 0, delete),
            // Without an idle rule a waiter is left to its member.
            (Queued, None, Some(0), None, false, holds, false, 99, keep(None)),
            (New, None, None, None, false, holds, false, 99, keep(None)),
            // A failed attempt nobody came back to goes after the grace.
            (Queued, None, Some(0), Some(0), false, TIMED, false, 0, keep(Some(3))),
            (Queued, None, Some(0), Some(0), false, TIMED, false, 3, delete),
            (Queued, None, Some(0), Some(0), false, TIMED, true, 3, keep(None)),
            // A call since the failure: the registry knows the entry.
            (Queued, None, Some(1), Some(0), false, TIMED, false, 3, keep(Some(11))),
            (New, None, Some(0), Some(0), true, TIMED, false, 1, keep(Some(3))),
            // A lost create is deleted once idle, subscribed or not; an idle empty one forgotten.
            (New, None, Some(0), None, false, TIMED, false, 0, keep(Some(10))),
            (New, None, Some(0), None, false, TIMED, false, 10, forget),
            (New, None, Some(0), None, false, TIMED, true, 10, keep(None)),
            (New, None, Some(0), None, true, TIMED, true, 10, delete),
            (Done, None, Some(0), None, false, TIMED, false, 10, forget),
            // A zombie's deletion is retried on its own.
            (Zombie, None, Some(0), None, false, TIMED, false, 10, keep(None)),
        ];
        let t0 = Instant::now();
        let at = |s: Option<u64>| s.map(|s| t0 + S * s as u32);
        for (i, (stage, deadline, touched, failed, maybe, rules, sub, now, want)) in
            cases.into_iter().enumerate()
        {
            let c = Contender {
                stage,
                deadline: at(deadline),
                touched: at(touched),
                maybe_created: maybe,
                failed_at: at(failed),
                own: (),
            };
            let want = want.map_or_else(|f| f, |k| Fate::Keep(at(k)));
            assert_eq!(c.fate(&rules, sub, t0 + S * now as u32), want, "case {i}");
        }
    }

    #[test]
    fn holding_sets_the_stage_and_deadline_and_the_handle_is_reached_through() {
        let mut c = Contender::new(7u32);
        assert_eq!(
            (c.stage, c.deadline, c.maybe_created),
            (Stage::New, None, false)
        );
        assert!(c.touched.is_some() && !c.held());
        let t = Instant::now() + S;
        c.hold(t);
        assert!(c.held());
        assert_eq!(c.deadline, Some(t));
        *c += 1;
        assert_eq!(*c, 8);
    }
}
