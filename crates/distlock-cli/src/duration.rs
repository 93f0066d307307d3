//! Durations on the command line, with the library's one rule ([`distlock::duration`]):
//! `500ms`, `30s`, `2m`, `1h`, `1d`, `1.5s`, `1m30s`, or a number of seconds; the same as in
//! backend URLs (`?connect_timeout=1h`).

use std::time::Duration;

/// Parses a duration (a clap value parser): the library's rule, its message as the error.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    distlock::duration::parse_duration(text).map_err(|e| e.to_string())
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

/// `--at-least`: at most a day (the longest lease), as a job's schedule never needs more.
pub fn parse_at_least(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > distlock::MAX_LEASE {
        return Err(format!(
            "--at-least {} is longer than {}",
            human(d),
            human(distlock::MAX_LEASE)
        ));
    }
    Ok(d)
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
    fn the_rule_of_backend_urls() {
        // `--lease 1h` and `?connect_timeout=1h` mean the same; so do `10` and `10s`.
        for (text, expected) in [
            ("1h", ms(3_600_000)),
            ("1m30s", ms(90_000)),
            ("1.5s", ms(1500)),
            ("10", ms(10_000)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        for bad in ["", "1M", "5 s", "1m30", "-1s"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(!err.contains('\n') && err.contains("500ms"), "{err}");
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
