//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`, `1.5s`, `1m30s`.
//!
//! Kept instead of `humantime::parse_duration`, which also accepts `5 s`, `1sec`, `1M` (a month)
//! and `1y`: this parser takes only the five short units the help shows, so `1M` is never read
//! as a month where `1m` was meant (`rejects_garbage` pins the refusals).

use std::time::Duration;

/// Nanoseconds per unit, longest suffix first so that `ms` is not read as `m`.
const UNITS: &[(&str, u128)] = &[
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

const EXAMPLES: &str = "write it like 500ms, 30s, 2m or 1h";

/// Parses a duration: one or more `<number><unit>` groups with units `ms`, `s`, `m`, `h`, `d`;
/// the number may have a decimal fraction (`1.5s`). A bare number is refused because its unit
/// would be a guess.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("empty duration; {EXAMPLES}"));
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..digits_end];
        rest = &rest[digits_end..];
        if number.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: expected a number; {EXAMPLES}"
            ));
        }
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        if unit.is_empty() {
            return Err(format!(
                "invalid duration {s:?}: the unit is missing; {EXAMPLES}"
            ));
        }
        let Some(&(_, per_unit)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m, h or d)"
            ));
        };
        let nanos = number_to_nanos(number, per_unit).ok_or_else(|| {
            format!("invalid duration {s:?}: {number:?} is not a number or too large")
        })?;
        total = total
            .checked_add(nanos)
            .ok_or_else(|| format!("invalid duration {s:?}: too large"))?;
    }
    let nanos = u64::try_from(total).map_err(|_| format!("invalid duration {s:?}: too large"))?;
    Ok(Duration::from_nanos(nanos))
}

/// `12` or `1.25` times `per_unit` nanoseconds; `None` when malformed or overflowing.
fn number_to_nanos(number: &str, per_unit: u128) -> Option<u128> {
    let (int, frac) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
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
        let digit = u128::from(c.to_digit(10)?);
        nanos = nanos.checked_add(digit * scale)?;
    }
    Some(nanos)
}

/// A duration that must be a positive lease within the library's bounds.
pub fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = parse_duration(text)?;
    if lease.is_zero() {
        return Err("the lease must be longer than zero".to_owned());
    }
    if lease < distlock::MIN_LEASE || lease > distlock::MAX_LEASE {
        return Err(format!(
            "the lease {} is outside {}..={}",
            human(lease),
            human(distlock::MIN_LEASE),
            human(distlock::MAX_LEASE)
        ));
    }
    Ok(lease)
}

/// A short human form: `300ms`, `2.5s`, `12s`, `2m05s`, `1h00m`.
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    if secs < 10 {
        let tenths = (ms % 1000) / 100;
        return if tenths == 0 {
            format!("{secs}s")
        } else {
            format!("{secs}.{tenths}s")
        };
    }
    if secs < 60 {
        return format!("{secs}s");
    }
    if secs < 3600 {
        return format!("{}m{:02}s", secs / 60, secs % 60);
    }
    format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("30s"), Ok(ms(30_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("1d"), Ok(ms(86_400_000)));
        assert_eq!(parse_duration(" 0s "), Ok(Duration::ZERO));
    }

    #[test]
    fn parses_fractions_and_compounds() {
        assert_eq!(parse_duration("1.5s"), Ok(ms(1500)));
        assert_eq!(parse_duration(".25s"), Ok(ms(250)));
        assert_eq!(parse_duration("0.5m"), Ok(ms(30_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1h2m3s4ms"), Ok(ms(3_723_004)));
        assert_eq!(parse_duration("1.0000000001s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            " ",
            "30",
            "s",
            "ms",
            "abc",
            "10x",
            "1.2.3s",
            "1.s",
            "5 s",
            "-1s",
            "+1s",
            "1S",
            "1sec",
            "1m30",
            "1e3ms",
            "9999999999999999999999999999999999h",
            "300000000000h",
        ] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(!err.contains('\n'), "one line: {err}");
        }
    }

    #[test]
    fn lease_must_be_in_range() {
        assert_eq!(parse_lease("30s"), Ok(ms(30_000)));
        assert_eq!(parse_lease("10ms"), Ok(ms(10)));
        assert_eq!(parse_lease("24h"), Ok(ms(86_400_000)));
        assert!(parse_lease("0s").unwrap_err().contains("longer than zero"));
        assert!(parse_lease("0ms").is_err());
        assert!(parse_lease("9ms").unwrap_err().contains("outside"));
        assert!(parse_lease("25h").is_err());
        assert!(parse_lease("nope").is_err());
    }

    #[test]
    fn human_forms() {
        assert_eq!(human(ms(300)), "300ms");
        assert_eq!(human(ms(1000)), "1s");
        assert_eq!(human(ms(2500)), "2.5s");
        assert_eq!(human(ms(12_345)), "12s");
        assert_eq!(human(ms(125_000)), "2m05s");
        assert_eq!(human(ms(3_600_000)), "1h00m");
    }
}
