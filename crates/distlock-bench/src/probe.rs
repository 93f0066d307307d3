//! A timeline of the library's `distlock::probe` trace events, for finding where a slow
//! hand-over spends its time: when `DISTLOCK_BENCH_PROBE` names a directory, a worker records
//! each such event (its `ev` field and `CLOCK_MONOTONIC` instant) in memory and writes them,
//! one `[ns, ev]` line each, to `<dir>/<proc id>.jsonl` at its end. Without the variable no
//! subscriber is installed and the events cost nothing.

use std::sync::Mutex;

use crate::mono_ns;
use crate::only::{Hooks, Only};

static EVENTS: Mutex<Vec<(u64, &'static str)>> = Mutex::new(Vec::new());

const TARGET: &str = "distlock::probe";

/// Installs the recorder when `DISTLOCK_BENCH_PROBE` is set.
pub fn install() {
    if std::env::var_os("DISTLOCK_BENCH_PROBE").is_some() {
        let _ = tracing::subscriber::set_global_default(Only(Probe));
    }
}

/// Records `ev` now (for the worker's own instants).
pub fn mark(ev: &'static str) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("DISTLOCK_BENCH_PROBE").is_some()) {
        push(ev);
    }
}

fn push(ev: &'static str) {
    let t = mono_ns();
    EVENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((t, ev));
}

/// Writes the recorded events of process `proc_id`.
pub fn dump(proc_id: u64) {
    let Some(dir) = std::env::var_os("DISTLOCK_BENCH_PROBE") else {
        return;
    };
    let events = std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|e| e.into_inner()));
    let mut out = String::new();
    for (t, ev) in events {
        out.push_str(&format!("[{t},\"{ev}\"]\n"));
    }
    let path = std::path::Path::new(&dir).join(format!("{proc_id}.jsonl"));
    let _ = std::fs::write(path, out);
}

struct Probe;

struct Ev(Option<&'static str>);

impl tracing::field::Visit for Ev {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "ev" {
            // The probes name their events with literals; leaked once per distinct name.
            self.0 = Some(intern(value));
        }
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.iter().find(|n| **n == s) {
        return n;
    }
    let n: &'static str = Box::leak(s.to_owned().into_boxed_str());
    names.push(n);
    n
}

impl Hooks for Probe {
    fn wants(m: &tracing::Metadata<'_>) -> bool {
        m.is_event() && m.target() == TARGET
    }
    fn event(&self, e: &tracing::Event<'_>) {
        let mut ev = Ev(None);
        e.record(&mut ev);
        if let Some(name) = ev.0 {
            push(name);
        }
    }
}
