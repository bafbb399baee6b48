//! Streaming lines out of a file the agent controls, in bounded memory.
//!
//! A file can be one "line" of gigabytes: a sparse file (`truncate -s 64G`)
//! reads as zeros with no `\n`. `BufRead::read_until` would buffer all of
//! it (an OOM kill loses every unsynced edit of every session, decision 10),
//! so lines are read through `fill_buf`/`consume`: at most `keep` bytes of
//! a line are held, the rest of an over-long line is counted and dropped,
//! and the deadline and a byte budget are checked at every buffer-full.

use std::io::{self, BufRead};
use std::time::Instant;

/// One line as streamed: its bytes (at most `keep`, without the `\n`) and
/// whether a `\n` ended it (the file's last line may have none); or, for a
/// line longer than `keep`, `overlong` with no bytes, visited as soon as it
/// overflows (once; the rest of it is read past, never held).
pub(super) struct Line<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) overlong: bool,
    pub(crate) terminated: bool,
}

/// Why [`each_line`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// The end of the file: every line was visited.
    End,
    /// The visitor asked to stop.
    Visitor,
    /// The deadline passed.
    Deadline,
    /// `budget` bytes were read; the rest of the file was not.
    Budget,
}

/// Visit the lines of `reader`, holding at most `keep` bytes of one line
/// and reading at most `budget` bytes in all, until the visitor returns
/// `false` or `deadline` passes (checked before each buffer-full).
pub(super) fn each_line(
    reader: &mut impl BufRead,
    keep: usize,
    budget: u64,
    deadline: Instant,
    mut visit: impl FnMut(Line<'_>) -> bool,
) -> io::Result<Stop> {
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    let mut scanned: u64 = 0;
    loop {
        if Instant::now() >= deadline {
            return Ok(Stop::Deadline);
        }
        if scanned >= budget {
            return Ok(Stop::Budget);
        }
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            if !line.is_empty()
                && !overlong
                && !visit(Line {
                    bytes: &line,
                    overlong,
                    terminated: false,
                })
            {
                return Ok(Stop::Visitor);
            }
            return Ok(Stop::End);
        }
        let room = (budget - scanned).min(buf.len() as u64) as usize;
        let buf = &buf[..room];
        let (chunk, terminated) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        let mut go = true;
        if !overlong {
            if line.len() + chunk.len() > keep {
                // Visited now, once: its end may be gigabytes away.
                overlong = true;
                line = Vec::new(); // give the memory back, not just the length
                go = visit(Line {
                    bytes: &[],
                    overlong: true,
                    terminated: false,
                });
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = chunk.len() + usize::from(terminated);
        reader.consume(used);
        scanned += used as u64;
        if !go {
            return Ok(Stop::Visitor);
        }
        if terminated {
            if !overlong {
                go = visit(Line {
                    bytes: &line,
                    overlong: false,
                    terminated: true,
                });
            }
            line.clear();
            overlong = false;
            if !go {
                return Ok(Stop::Visitor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lines(text: &[u8], keep: usize, budget: u64) -> (Vec<(String, bool, bool)>, Stop) {
        let mut out = Vec::new();
        // A tiny buffer: lines cross buffer-fulls.
        let mut reader = io::BufReader::with_capacity(3, text);
        let stop = each_line(
            &mut reader,
            keep,
            budget,
            Instant::now() + Duration::from_secs(60),
            |l| {
                out.push((
                    String::from_utf8_lossy(l.bytes).into_owned(),
                    l.overlong,
                    l.terminated,
                ));
                true
            },
        )
        .unwrap();
        (out, stop)
    }

    #[test]
    fn lines_cross_buffers_and_over_long_ones_are_flagged_not_held() {
        let (out, stop) = lines(b"ab\nlong line\n\nlast", 4, u64::MAX);
        assert_eq!(stop, Stop::End);
        assert_eq!(
            out,
            [
                ("ab".into(), false, true),
                ("".into(), true, false),
                ("".into(), false, true),
                ("last".into(), false, false),
            ]
        );
        let (out, stop) = lines(b"ab\ncd\n", 4, 4);
        assert_eq!(stop, Stop::Budget);
        assert_eq!(out, [("ab".into(), false, true)]);
        let (out, _) = lines(b"", 4, u64::MAX);
        assert!(out.is_empty());
    }
}
