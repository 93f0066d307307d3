//! Small helpers: output that never panics, wall-clock times, one-line errors.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Writes a line to stdout, ignoring errors (a closed pipe must not panic).
pub fn out(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// Writes `distlock: <message>` to stderr as one line, ignoring errors.
pub fn say(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "distlock: {}", one_line(message));
}

/// Folds a multi-line message into one line.
pub fn one_line(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for part in message
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(part);
    }
    out
}

/// True when stderr is a terminal.
pub fn stderr_is_terminal() -> bool {
    nix::unistd::isatty(std::io::stderr()).unwrap_or(false)
}

/// The time of day of `t` in UTC as `HH:MM:SS.mmm`.
pub fn clock(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    clock_of_epoch_millis(since.as_millis())
}

fn clock_of_epoch_millis(ms: u128) -> String {
    let day_ms = ms % 86_400_000;
    let (h, rest) = (day_ms / 3_600_000, day_ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    format!("{h:02}:{m:02}:{s:02}.{milli:03}")
}

/// The fence a `distlock run` holder sees in `DISTLOCK_FENCE` for a backend fence: the
/// registry puts the backend's fence above 10 bits of local handoff count (see
/// `LockGuard::fence`), and a `run` process never hands off locally.
pub fn holder_fence(backend_fence: u64) -> u64 {
    backend_fence.saturating_mul(1 << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_formats_utc_time_of_day() {
        assert_eq!(clock(UNIX_EPOCH), "00:00:00.000");
        assert_eq!(
            clock(UNIX_EPOCH + Duration::from_millis(86_400_000 * 3 + 12 * 3_600_000 + 3_002)),
            "12:00:03.002"
        );
        assert_eq!(clock_of_epoch_millis(86_399_999), "23:59:59.999");
    }

    #[test]
    fn messages_become_one_line() {
        assert_eq!(one_line("a\nb\r\n  c  \n\n"), "a b c");
        assert_eq!(one_line("single"), "single");
    }

    #[test]
    fn holder_fence_shifts_by_ten_bits() {
        assert_eq!(holder_fence(4), 4096);
        assert_eq!(holder_fence(u64::MAX), u64::MAX);
    }
}
