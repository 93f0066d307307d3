//! A tracing subscriber that sees only the callsites a [`Hooks`] wants, so that the rest of the
//! library's tracing costs nothing, and hands what it sees to the hooks.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata};

static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

/// What a worker does with the spans and events it asked for.
pub trait Hooks: Send + Sync + 'static {
    /// Whether to see this callsite's spans or events at all.
    fn wants(m: &Metadata<'_>) -> bool;
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self) {}
    fn clone_span(&self) {}
    fn close(&self) {}
}

/// The subscriber of `H`.
pub struct Only<H>(pub H);

impl<H: Hooks> tracing::Subscriber for Only<H> {
    fn register_callsite(&self, m: &'static Metadata<'static>) -> Interest {
        if H::wants(m) {
            Interest::always()
        } else {
            Interest::never()
        }
    }
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        H::wants(m)
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(NEXT_SPAN.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        self.0.event(e);
    }
    fn enter(&self, _: &Id) {
        self.0.enter();
    }
    fn exit(&self, _: &Id) {}
    fn clone_span(&self, id: &Id) -> Id {
        self.0.clone_span();
        id.clone()
    }
    fn try_close(&self, _: Id) -> bool {
        self.0.close();
        true
    }
}
