//! Durations as people write them, with one rule for every place that takes one: the `distlock`
//! command's options (`--lease 1h`), its environment (`DISTLOCK_KILL_GRACE`) and the query
//! parameters of backend URLs (`?connect_timeout=1h`).
//!
//! A duration is one or more `<number><unit>` groups with the units `ms`, `s`, `m`, `h` and `d`
//! (`500ms`, `30s`, `1m30s`, `1.5h`); a number alone means seconds (`10`, as `sleep 10`,
//! `timeout 10` and libpq's `connect_timeout=10`).
//!
//! Kept instead of `humantime::parse_duration`, which refuses a number alone and also accepts
//! `5 s`, `1sec`, `1M` (a month) and `1y`: here only the five short units are known, so `1M` is
//! never read as a month where `1m` was meant.

use std::fmt;
use std::time::Duration;

/// Nanoseconds per unit.
const UNITS: &[(&str, u128)] = &[
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Why a text is not a duration: one line that shows the text and how to write one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDurationError {
    message: String,
}

impl fmt::Display for ParseDurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParseDurationError {}

/// Parses a duration ([module docs](self)): `500ms`, `30s`, `2m`, `1h`, `1d`, `1.5s`, `1m30s`,
/// or a number of seconds such as `10` or `0.5`. Spaces around the text are ignored; spaces
/// inside it, signs, exponents and other units are refused.
///
/// ```
/// use std::time::Duration;
/// use distlock::duration::parse_duration;
/// assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert!(parse_duration("1M").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, ParseDurationError> {
    let s = text.trim();
    let bad = |why: &str| ParseDurationError {
        message: format!("invalid duration {s:?}: {why}; write it like 500ms, 30s, 2m or 1h"),
    };
    if s.is_empty() {
        return Err(bad("it is empty"));
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut groups = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        if number.is_empty() {
            return Err(bad("expected a number"));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        rest = after;
        groups += 1;
        // A number alone is seconds; in a compound every number needs its unit (`1m30` is a
        // typo, not 1m30s).
        let unit = match unit {
            "" if groups == 1 && rest.is_empty() => "s",
            "" => return Err(bad("the unit is missing")),
            u => u,
        };
        let Some(&(_, per_unit)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(bad(&format!(
                "unknown unit {unit:?} (use ms, s, m, h or d)"
            )));
        };
        let nanos = number_to_nanos(number, per_unit)
            .ok_or_else(|| bad(&format!("{number:?} is not a number or is too large")))?;
        total = total.checked_add(nanos).ok_or_else(|| bad("too large"))?;
    }
    let nanos = u64::try_from(total).map_err(|_| bad("too large"))?;
    Ok(Duration::from_nanos(nanos))
}

/// `12` or `1.25` times `per_unit` nanoseconds; `None` when malformed or overflowing.
fn number_to_nanos(number: &str, per_unit: u128) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') || number.ends_with('.') {
        return None;
    }
    if int.len() > 30 {
        return None;
    }
    let int_value: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut nanos = int_value.checked_mul(per_unit)?;
    // Fraction digits beyond nanosecond precision are dropped.
    let mut scale = per_unit;
    for c in frac.chars() {
        scale /= 10;
        nanos = nanos.checked_add(u128::from(c.to_digit(10)?) * scale)?;
    }
    Some(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn each_unit() {
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse_duration(" 0s "), Ok(Duration::ZERO));
    }

    #[test]
    fn a_number_alone_is_seconds() {
        assert_eq!(parse_duration("10"), Ok(ms(10_000)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.5"), Ok(ms(500)));
    }

    #[test]
    fn fractions_and_compounds() {
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration(".25s"), Ok(ms(250)));
        assert_eq!(parse_duration("0.5m"), Ok(ms(30_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1h2m3s4ms"), Ok(ms(3_723_004)));
        assert_eq!(parse_duration("1.0000000001s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn garbage_is_refused_in_one_line() {
        for bad in [
            "",
            " ",
            "s",
            "ms",
            "abc",
            "10x",
            "1.2.3s",
            "1.s",
            "1.",
            "5 s",
            "-1s",
            "+1s",
            "1S",
            "1M",
            "1sec",
            "1m30",
            "30s5",
            "1e3ms",
            "9999999999999999999999999999999999h",
            "300000000000h",
        ] {
            let err = parse_duration(bad).expect_err(bad).to_string();
            assert!(!err.contains('\n'), "one line: {err}");
            assert!(err.contains("500ms"), "says how to write one: {err}");
        }
    }
}
