//! `glob`'s walk: the pattern read segment by segment, as Python's
//! `Path.glob` reads it, so symbolic links are followed exactly where the
//! reference follows them.
//!
//! `Path.glob` (the reference's `glob` tool) matches one segment of the
//! pattern per directory level. A plain or wildcard segment (`src`, `*`,
//! `v[0-9]`) matches a name, and a symlinked directory it matches is
//! entered; `**` matches any number of directories but never enters a
//! symlinked one (so a link loop cannot make it recurse for ever). The
//! reference then keeps only the matches whose canonical path lies inside
//! the search root. Here:
//!
//! - the pattern is a small automaton over its segments ([`Pattern`]): the
//!   positions a name may be at ([`States`]), stepped once per name, with
//!   the states reached through plain segments only kept apart — those are
//!   what a symlinked directory is entered with;
//! - the walk goes by directory fd, never by path, in name order, depth
//!   first; a symlink met is resolved by [`super::resolve`] with the search
//!   root as the only anchor (so what it leads to lies inside the search
//!   root, or it is dropped), and followed when it leads to a regular file
//!   (listed under the link's own name, as the reference lists it) or to a
//!   directory the pattern may still go into;
//! - the bounds are the other walk's: 50,000 entries, 256 levels, `.git`
//!   and `node_modules` skipped, and the call's deadline. A pattern has a
//!   fixed number of plain segments, so a loop of links is entered at most
//!   that many times.
//!
//! Only regular files are listed (a link to one included), newest first.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use rustix::fs::{AtFlags, FileType, Mode, Stat};

use super::ToolError;
use super::resolve::{self, Anchor};
use super::walk::{SKIPPED_DIRS, WALK_MAX_DEPTH, WALK_MAX_ENTRIES, mtime_ns, sorted_names};
use crate::fsx::{self, Kind};

/// One segment of a pattern.
#[derive(Debug)]
enum Segment {
    /// `**`: any number of directories (none included).
    Recursive,
    /// Anything else: one name.
    Name(NameMatcher),
}

/// What one name is matched with. Most segments an agent writes are plain
/// names and `*` wildcards (`src`, `*.rs`, `test_*.py`): those are matched
/// here as text, because compiling a `globset` matcher builds a regex (a
/// dense DFA for a small pattern: a few tens of microseconds, a few percent
/// of a whole tool call). Anything else (`?`, `[…]`, `{…}`, `\`) is
/// globset's. Both agree on every name (a property test holds them to it).
#[derive(Debug)]
enum NameMatcher {
    /// The segment split at its `*`s: a name matches when it starts with
    /// the first part, ends with the last, and holds the others in order
    /// between them (one part: the name is that part).
    Stars(Vec<Vec<u8>>),
    Glob(globset::GlobMatcher),
}

impl NameMatcher {
    fn new(segment: &str) -> Result<NameMatcher, globset::Error> {
        if !segment.contains(['?', '[', ']', '{', '}', '\\']) {
            return Ok(NameMatcher::Stars(
                segment.split('*').map(|p| p.as_bytes().to_vec()).collect(),
            ));
        }
        Ok(NameMatcher::Glob(globset_matcher(segment)?))
    }

    fn is_match(&self, name: &OsStr) -> bool {
        let parts = match self {
            NameMatcher::Glob(m) => return m.is_match(Path::new(name)),
            NameMatcher::Stars(parts) => parts,
        };
        let name = name.as_bytes();
        let (first, rest) = parts.split_first().expect("split yields a part");
        let Some((last, middle)) = rest.split_last() else {
            return name == first.as_slice();
        };
        if name.len() < first.len() + last.len()
            || !name.starts_with(first)
            || !name.ends_with(last)
        {
            return false;
        }
        // Each middle part at its leftmost place after the one before:
        // with `*` as the only wildcard, the leftmost fit never loses a match.
        let mut between = &name[first.len()..name.len() - last.len()];
        for part in middle {
            match find(between, part) {
                Some(at) => between = &between[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// globset's matcher for one segment, configured as `Path.glob` reads it.
fn globset_matcher(segment: &str) -> Result<globset::GlobMatcher, globset::Error> {
    Ok(globset::GlobBuilder::new(segment)
        .literal_separator(true)
        .backslash_escape(true)
        .build()?
        .compile_matcher())
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A `glob` pattern, split at `/` (empty and `.` segments dropped, as
/// `Path.glob` drops them).
#[derive(Debug)]
pub(crate) struct Pattern {
    segments: Vec<Segment>,
}

/// Positions in a [`Pattern`] the next name may be matched at, sorted;
/// `segments.len()` means the whole pattern has matched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct States(Vec<usize>);

impl Pattern {
    pub(crate) fn parse(pattern: &str) -> Result<Pattern, ToolError> {
        let segments = pattern
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .map(|s| {
                if s == "**" {
                    return Ok(Segment::Recursive);
                }
                if s.contains("**") {
                    // `Path.glob`'s own refusal, in its words.
                    return Err(ToolError::new(
                        "glob: Invalid pattern: '**' can only be an entire path component",
                    ));
                }
                NameMatcher::new(s)
                    .map(Segment::Name)
                    .map_err(|e| ToolError::new(format!("glob: {}", e.kind())))
            })
            .collect::<Result<_, _>>()?;
        Ok(Pattern { segments })
    }

    fn end(&self) -> usize {
        self.segments.len()
    }

    /// `positions` with every `**` also skipped (it may match no directory).
    fn close(&self, mut positions: Vec<usize>) -> States {
        let mut i = 0;
        while i < positions.len() {
            let at = positions[i];
            if matches!(self.segments.get(at), Some(Segment::Recursive)) {
                positions.push(at + 1);
            }
            i += 1;
        }
        positions.sort_unstable();
        positions.dedup();
        States(positions)
    }

    /// Where the search root's entries start.
    pub(crate) fn start(&self) -> States {
        self.close(vec![0])
    }

    /// The states after the name `name`: through any segment, and through
    /// plain segments only (what a symlinked directory is entered with).
    pub(crate) fn step(&self, states: &States, name: &OsStr) -> (States, States) {
        let mut plain = Vec::new();
        let mut recursive = Vec::new();
        for &at in &states.0 {
            match self.segments.get(at) {
                Some(Segment::Recursive) => recursive.push(at),
                Some(Segment::Name(m)) if m.is_match(name) => plain.push(at + 1),
                _ => {}
            }
        }
        let plain = self.close(plain);
        recursive.extend(&plain.0);
        (self.close(recursive), plain)
    }

    /// Has the whole pattern matched?
    pub(crate) fn matched(&self, states: &States) -> bool {
        states.0.contains(&self.end())
    }

    /// May a name below still match (is a directory worth entering)?
    pub(crate) fn pending(&self, states: &States) -> bool {
        states.0.iter().any(|&at| at < self.end())
    }
}

/// A directory being walked: its fd, its path below the search root as
/// spelled (links by their own names), its canonical path, its depth and
/// the pattern's states for its entries.
struct Level {
    fd: OwnedFd,
    rel: PathBuf,
    canonical: PathBuf,
    depth: usize,
    states: States,
}

/// A directory still to walk: its parent, its name there, the states it is
/// entered with, and whether it is a symlink (to resolve again then).
struct Pending {
    parent: Rc<Level>,
    name: CString,
    states: States,
    link: bool,
}

/// What a symlink in the walk leads to, inside the search root.
enum Followed {
    File(Stat),
    /// A directory (`O_PATH`) and its canonical path.
    Dir(OwnedFd, PathBuf),
}

/// The search root: its fd and canonical path, the only anchor links in
/// the walk may resolve to.
pub(crate) struct SearchRoot<'a> {
    pub(crate) fd: &'a OwnedFd,
    pub(crate) canonical: &'a Path,
}

impl SearchRoot<'_> {
    /// Resolve the symlink `name` in `level` with the search root as the
    /// only anchor: `None` when it leads outside the search root, loops,
    /// dangles, or changed since it was listed.
    fn follow(&self, level: &Level, name: &CString) -> Option<Followed> {
        let name = name.to_str().ok()?;
        let (link, kind) = fsx::lookup_at(&level.fd, name).ok()?;
        if kind != Kind::Symlink {
            return None;
        }
        let target = level.canonical.join(fsx::link_target(&link).ok()?);
        let spellings = [self.canonical.to_path_buf()];
        let anchors = [Anchor {
            spellings: &spellings,
            canonical: self.canonical,
            fd: Some(self.fd.as_fd()),
            file: None,
        }];
        let resolved = resolve::resolve(&anchors, &target, &mut 1).ok()?;
        if resolved.missing > 0 {
            return None;
        }
        let fd = match resolved.leaf {
            Some(fd) => fd,
            // The search root itself (`loop -> .`).
            None => fsx::reopen_dir(self.fd).ok()?,
        };
        let st = rustix::fs::fstat(&fd).ok()?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Some(Followed::File(st)),
            FileType::Directory => Some(Followed::Dir(fd, resolved.canonical)),
            _ => None,
        }
    }

    /// Open the directory `p` names for listing: a real subdirectory
    /// (never through a symlink swapped in since), or a symlink resolved
    /// again inside the search root.
    fn enter(&self, p: &Pending) -> Option<Level> {
        let rel = p.parent.rel.join(OsStr::from_bytes(p.name.as_bytes()));
        let (fd, canonical) = if p.link {
            match self.follow(&p.parent, &p.name)? {
                Followed::Dir(fd, canonical) => (fsx::reopen_dir(&fd).ok()?, canonical),
                Followed::File(_) => return None,
            }
        } else {
            // A mount of /proc or /sys below the root (a root of `/`) is skipped.
            let fd = rustix::fs::openat(
                &p.parent.fd,
                p.name.as_c_str(),
                fsx::DIR_FLAGS,
                Mode::empty(),
            )
            .and_then(fsx::refuse_pseudo_fs)
            .ok()?;
            (
                fd,
                p.parent
                    .canonical
                    .join(OsStr::from_bytes(p.name.as_bytes())),
            )
        };
        Some(Level {
            fd,
            rel,
            canonical,
            depth: p.parent.depth + 1,
            states: p.states.clone(),
        })
    }

    /// One entry of `level`: a matching regular file (or a link to one) is
    /// `found`; a directory (or a link to one) the pattern may still go into
    /// is answered, to be entered.
    fn visit(
        &self,
        pattern: &Pattern,
        level: &Rc<Level>,
        name: CString,
        found: &mut impl FnMut(PathBuf, i128),
    ) -> Option<Pending> {
        let deeper = level.depth < WALK_MAX_DEPTH;
        let os_name = OsStr::from_bytes(name.as_bytes());
        let (all, plain) = pattern.step(&level.states, os_name);
        if !pattern.matched(&all) && !pattern.pending(&all) {
            return None;
        }
        let stat =
            rustix::fs::statat(&level.fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let skipped = SKIPPED_DIRS.contains(&name.as_bytes());
        let rel = || level.rel.join(os_name);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile if pattern.matched(&all) => found(rel(), mtime_ns(&stat)),
            FileType::Directory if !skipped && deeper && pattern.pending(&all) => {
                return Some(Pending {
                    parent: level.clone(),
                    name,
                    states: all,
                    link: false,
                });
            }
            FileType::Symlink => match self.follow(level, &name) {
                Some(Followed::File(st)) if pattern.matched(&all) => {
                    found(rel(), mtime_ns(&st));
                }
                Some(Followed::Dir(..)) if !skipped && deeper && pattern.pending(&plain) => {
                    return Some(Pending {
                        parent: level.clone(),
                        name,
                        states: plain,
                        link: true,
                    });
                }
                _ => {}
            },
            _ => {}
        }
        None
    }

    /// Walk the search root for `pattern`, calling `found` with each
    /// matching regular file's path below the root (as spelled) and its
    /// modification time (ns). `Err(())` when the deadline passed.
    pub(crate) fn walk(
        &self,
        pattern: &Pattern,
        deadline: Instant,
        mut found: impl FnMut(PathBuf, i128),
    ) -> Result<(), ()> {
        let mut stack: Vec<Pending> = Vec::new();
        let mut seen = 0usize;
        let mut next = fsx::reopen_dir(self.fd).ok().map(|fd| Level {
            fd,
            rel: PathBuf::new(),
            canonical: self.canonical.to_path_buf(),
            depth: 0,
            states: pattern.start(),
        });
        loop {
            let level = match next.take() {
                Some(level) => level,
                None => {
                    let Some(p) = stack.pop() else { return Ok(()) };
                    match self.enter(&p) {
                        Some(level) => level,
                        None => continue,
                    }
                }
            };
            let Some(names) = sorted_names(&level.fd) else {
                continue;
            };
            let level = Rc::new(level);
            // Depth-first in name order: push directories in reverse.
            let mut dirs = Vec::new();
            for name in names {
                seen += 1;
                if seen > WALK_MAX_ENTRIES {
                    return Ok(());
                }
                if seen.is_multiple_of(256) && Instant::now() >= deadline {
                    return Err(());
                }
                dirs.extend(self.visit(pattern, &level, name, &mut found));
            }
            stack.extend(dirs.into_iter().rev());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn globset_matches(segment: &str, name: &OsStr) -> bool {
        globset_matcher(segment).unwrap().is_match(Path::new(name))
    }

    proptest! {
        /// The text matcher answers as globset does, on any name (non-UTF-8
        /// bytes and dots included), for every segment it takes.
        #[test]
        fn plain_and_star_segments_match_as_globset_does(
            segment in "[ab.é*]{1,7}".prop_map(|s| {
                // `**` is a segment of its own (or refused), never a name.
                let mut s = s;
                while s.contains("**") {
                    s = s.replace("**", "*");
                }
                s
            }),
            name in proptest::collection::vec(
                prop_oneof![Just(b'a'), Just(b'b'), Just(b'.'), Just(0xc3u8), Just(0xa9u8), Just(0xffu8)],
                0..9,
            ),
        ) {
            let name = OsStr::from_bytes(&name);
            let matcher = NameMatcher::new(&segment).unwrap();
            prop_assert!(matches!(matcher, NameMatcher::Stars(_)));
            prop_assert_eq!(matcher.is_match(name), globset_matches(&segment, name), "{} {:?}", segment, name);
        }
    }

    #[test]
    fn only_plain_and_star_segments_skip_globset() {
        for (segment, text) in [
            ("a.txt", true),
            ("*.rs", true),
            ("test_*_x*", true),
            ("*", true),
            ("v?", false),
            ("v[0-9]", false),
            ("{a,b}.md", false),
            ("a\\*", false),
            ("a]", false),
        ] {
            let m = NameMatcher::new(segment).unwrap();
            assert_eq!(matches!(m, NameMatcher::Stars(_)), text, "{segment}");
        }
        // Names the text matcher must tell apart (overlapping parts).
        for (segment, name, want) in [
            ("ab*ab", "ab", false),
            ("ab*ab", "abab", true),
            ("a*b*c", "acc", false),
            ("a*b*c", "abcbc", true),
            ("*x*", "x", true),
            ("g*.txt", "g12.txt", true),
            ("g*.txt", "g12.txt.bak", false),
        ] {
            let m = NameMatcher::new(segment).unwrap();
            assert_eq!(m.is_match(OsStr::new(name)), want, "{segment} {name}");
            assert_eq!(
                globset_matches(segment, OsStr::new(name)),
                want,
                "globset: {segment} {name}"
            );
        }
    }

    fn run(pattern: &str, path: &str) -> bool {
        let p = Pattern::parse(pattern).unwrap();
        let mut states = p.start();
        for name in path.split('/') {
            states = p.step(&states, OsStr::new(name)).0;
        }
        p.matched(&states)
    }

    #[test]
    fn segments_match_as_path_glob_does_with_double_star_spanning_directories() {
        for (pattern, path, want) in [
            ("*.txt", "a.txt", true),
            ("*.txt", "d/a.txt", false),
            ("*/*.txt", "d/a.txt", true),
            ("**/*.txt", "a.txt", true),
            ("**/*.txt", "d/e/a.txt", true),
            ("d/**/a.txt", "d/a.txt", true),
            ("d/**/a.txt", "d/x/y/a.txt", true),
            ("d/**/a.txt", "e/a.txt", false),
            ("**", "d/a.txt", true),
            ("./d//a.txt", "d/a.txt", true),
            ("v[0-9]/*", "v1/x", true),
            ("v[0-9]/*", "va/x", false),
            ("*.txt", ".hidden.txt", true),
        ] {
            assert_eq!(run(pattern, path), want, "{pattern} {path}");
        }
    }

    #[test]
    fn a_symlinked_directory_is_entered_through_plain_segments_only() {
        let p = Pattern::parse("**/x/*.md").unwrap();
        let (all, plain) = p.step(&p.start(), OsStr::new("x"));
        // `**` may consume `x` (a real directory), or `x` matched plainly.
        assert!(p.pending(&all) && p.pending(&plain));
        let (all, plain) = p.step(&p.start(), OsStr::new("other"));
        // Only `**` consumes `other`: a link named so is not entered.
        assert!(p.pending(&all));
        assert!(!p.pending(&plain));
    }
}
