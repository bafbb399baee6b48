//! Human durations, as flags, variables and the endpoint file take them:
//! `90` (seconds), `90s`, `1m30s`, `250ms`, `1h`, `1.5s` — parsed, bounded
//! and shown back in the same notation.
//!
//! A leaf: it knows no option. The options' bounds live with their owners
//! (`config::bounds`, `memory::options`), which call in here.

use std::time::Duration;

/// Parse a duration as the command line takes it: `90` (seconds), `90s`,
/// `1m30s`, `250ms`, `1h`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a duration (examples: 90, 90s, 1m30s, 250ms)");
    if text.is_empty() {
        return Err(bad());
    }
    let too_long = || {
        format!(
            "{text:?} is too long (at most {} days)",
            MAX_DURATION.as_secs() / 86_400
        )
    };
    if let Ok(secs) = text.parse::<f64>() {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(bad());
        }
        return Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(too_long);
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total = Duration::try_from_secs_f64(value * scale)
            .ok()
            .and_then(|part| total.checked_add(part))
            .filter(|d| *d <= MAX_DURATION)
            .ok_or_else(too_long)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// The longest duration any option takes (a year): beyond it, deadline
/// arithmetic (`Instant + d`) could overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// A duration within `[min, max]`, refused with both ends named.
pub(crate) fn parse_duration_within(
    text: &str,
    (min, max): (Duration, Duration),
) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < min || d > max {
        return Err(format!(
            "{text:?} is out of range: it must be between {} and {}",
            show_duration(min),
            show_duration(max)
        ));
    }
    Ok(d)
}

/// `90s`, `15m`, `1h`, `250ms`: a bound as a user would write it.
pub(crate) fn show_duration(d: Duration) -> String {
    let (n, unit) = whole_units(d);
    format!("{n}{unit}")
}

/// `d` in its largest whole unit: `(count, "h" | "m" | "s" | "ms")`; zero is `(0, "s")`.
pub(crate) fn whole_units(d: Duration) -> (u128, &'static str) {
    match d.as_millis() {
        0 => (0, "s"),
        ms if ms % 3_600_000 == 0 => (ms / 3_600_000, "h"),
        ms if ms % 60_000 == 0 => (ms / 60_000, "m"),
        ms if ms % 1000 == 0 => (ms / 1000, "s"),
        ms => (ms, "ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for (text, secs) in [
            ("90", 90.0),
            ("90s", 90.0),
            ("1m30s", 90.0),
            ("250ms", 0.25),
            ("1h", 3600.0),
            ("1.5s", 1.5),
            ("0", 0.0),
            ("2m", 120.0),
        ] {
            assert_eq!(
                parse_duration(text).unwrap(),
                Duration::from_secs_f64(secs),
                "{text}"
            );
        }
        for bad in ["", "s", "1x", "-5", "1m30", "m1", "1 m", "NaN", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        // Huge values are refused, never a panic or an overflow later.
        for huge in [
            "1e20",
            "1e18",
            "1e19s",
            "99999999999999999999h",
            "400000h",
            "367d",
        ] {
            assert!(parse_duration(huge).is_err(), "{huge}");
        }
        assert_eq!(parse_duration("8784h").unwrap(), MAX_DURATION);
    }
}
