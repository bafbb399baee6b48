//! The small pieces of Markdown the reference is written in: table cells,
//! and figures (durations, counts) the way a reader writes them.

use std::time::Duration;

/// `text` as one cell of a Markdown table: on one line, its pipes escaped.
pub(super) fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `text` (help written for a terminal) as Markdown that shows it as it
/// is: outside code spans, the characters Markdown would read as emphasis,
/// strike-through or HTML are escaped.
pub(super) fn plain(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(part);
            continue;
        }
        for c in part.chars() {
            if matches!(c, '*' | '~' | '<') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

/// A table: a header row, its rule, then one row per entry.
pub(super) fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    out.push_str(&format!("| {} |\n", header.join(" | ")));
    out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
}

/// `90 s`, `15 min`, `24 h`, `250 ms`: a bound as the reference shows it.
pub(super) fn duration(d: Duration) -> String {
    match crate::duration::whole_units(d) {
        (n, "m") => format!("{n} min"),
        (n, unit) => format!("{n} {unit}"),
    }
}

/// `1 s – 24 h`.
pub(super) fn durations((min, max): (Duration, Duration)) -> String {
    format!("{} – {}", duration(min), duration(max))
}

/// `600,000`: a count with its thousands separated.
pub(super) fn count(n: impl Into<u128>) -> String {
    let digits = n.into().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `32 KiB`, `1 MiB`: a size in the largest binary unit it fills exactly.
pub(super) fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{} bytes", count(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_a_person_writes_them() {
        assert_eq!(
            durations((Duration::ZERO, Duration::from_secs(900))),
            "0 s – 15 min"
        );
        assert_eq!(duration(Duration::from_secs(86_400)), "24 h");
        assert_eq!(duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(count(1_000_000u64), "1,000,000");
        assert_eq!(count(600u64), "600");
        assert_eq!(count(3_600u64), "3,600");
        assert_eq!(bytes(32 * 1024), "32 KiB");
        assert_eq!(bytes(1 << 20), "1 MiB");
        assert_eq!(cell("a |\n  b"), "a \\| b");
        assert_eq!(
            plain("'/a/*/b/*' `x*y` ~/.config <x>"),
            "'/a/\\*/b/\\*' `x*y` \\~/.config \\<x>"
        );
    }
}
