//! Configuration helpers shared by every mode.

use std::time::Duration;

/// Parse a duration as the command line takes it: `90` (seconds), `90s`,
/// `1m30s`, `250ms`, `1h`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a duration (examples: 90, 90s, 1m30s, 250ms)");
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = text.parse::<f64>() {
        return if secs.is_finite() && secs >= 0.0 {
            Ok(Duration::from_secs_f64(secs))
        } else {
            Err(bad())
        };
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
        total += Duration::from_secs_f64(value * scale);
        rest = &rest[unit_len..];
    }
    Ok(total)
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
        for bad in ["", "s", "1x", "-5", "1m30", "m1", "1 m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
