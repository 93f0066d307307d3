//! The per-token table every backend of the family keeps: what this process knows of each
//! owner token's entries on the server (its phase, its tasks and watches), and the reaper's plan
//! of those tokens. Forgetting a token drops its entry and its plan together, so that the reaper
//! never looks at a later entry of the same token at an instant planned for this one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

use super::reaper::Reaper;
use super::Locked;
use crate::backend::Token;

/// One entry `V` per owner token, and when the reaper looks at which token.
pub(crate) struct Table<V> {
    entries: Mutex<HashMap<Token, V>>,
    reaper: Reaper<Token>,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            entries: Mutex::new(HashMap::new()),
            reaper: Reaper::default(),
        }
    }
}

impl<V> Table<V> {
    /// The entries (a lock poisoned by a panic is taken over: every change keeps them whole).
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<Token, V>> {
        self.entries.locked()
    }

    /// The reaper's plan of the tokens (its task starts with [`Reaper::run`]).
    pub(crate) fn reaper(&self) -> &Reaper<Token> {
        &self.reaper
    }

    /// Looks at `token` at `at`, instead of when it was planned before.
    pub(crate) fn reap_at(&self, token: Token, at: Instant) {
        self.reaper.schedule(token, at);
    }

    /// Looks at `token` at `at` at the latest.
    pub(crate) fn reap_by(&self, token: Token, at: Instant) {
        self.reaper.schedule_by(token, at);
    }

    /// Forgets `token`, if its entry is one `which` picks, with its plan; returns the entry.
    pub(crate) fn forget_if(&self, token: Token, which: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut entries = self.lock();
        if !entries.get(&token).is_some_and(which) {
            return None;
        }
        self.reaper.cancel(token);
        entries.remove(&token)
    }

    /// Forgets `token`'s entry and its plan; returns the entry.
    pub(crate) fn forget(&self, token: Token) -> Option<V> {
        self.forget_if(token, |_| true)
    }
}

impl<V: Clone> Table<V> {
    /// `token`'s entry.
    pub(crate) fn get(&self, token: Token) -> Option<V> {
        self.lock().get(&token).cloned()
    }

    /// `token`'s entry, made by `new` when it has none.
    pub(crate) fn get_or_insert_with(&self, token: Token, new: impl FnOnce() -> V) -> V {
        self.lock().entry(token).or_insert_with(new).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_drops_the_entry_with_its_plan_only_when_picked() {
        let table: Table<u32> = Table::default();
        let (a, b) = (Token::random(), Token::random());
        assert_eq!(table.get_or_insert_with(a, || 1), 1);
        assert_eq!(table.get_or_insert_with(a, || 2), 1);
        table.get_or_insert_with(b, || 3);
        let at = Instant::now();
        table.reap_at(a, at);
        table.reap_by(b, at);
        assert_eq!(table.forget_if(a, |v| *v == 2), None);
        assert_eq!((table.get(a), table.reaper().len()), (Some(1), 2));
        assert_eq!(table.forget_if(a, |v| *v == 1), Some(1));
        assert_eq!((table.get(a), table.reaper().len()), (None, 1));
        assert_eq!(table.forget(b), Some(3));
        assert_eq!(table.reaper().len(), 0);
        assert_eq!(table.forget(b), None);
    }
}
