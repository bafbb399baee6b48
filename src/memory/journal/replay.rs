//! A journal read back. A torn tail — a last line without its newline, or
//! one whose checksum fails — is dropped and the lines before it stand;
//! anything else that fails is corruption, and the whole journal counts as
//! no baseline (see the [module docs](super) for why both are safe).

use super::format::{Header, Owner, Record, Snapshot, VERSION, decode_line};

/// What reading a journal back found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Replay {
    /// The state, and whether a torn last batch was dropped.
    Intact {
        owner: Owner,
        state: Snapshot,
        torn: bool,
        disposing: bool,
    },
    /// The checksums tell the journal is damaged: no baseline. `owner`
    /// when the header itself is intact (else nothing can be trusted).
    Corrupt {
        owner: Option<Owner>,
        reason: String,
    },
}

pub(super) fn corrupt(owner: Option<Owner>, reason: impl Into<String>) -> Replay {
    Replay::Corrupt {
        owner,
        reason: reason.into(),
    }
}

/// Read a journal's bytes back (see the module docs for torn and corrupt).
/// Every line after the header is one batch of records (what one release
/// of the state lock changed): a batch applies whole or not at all.
pub(crate) fn replay(bytes: &[u8]) -> Replay {
    let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // The piece after the last newline is a batch that never finished.
    let unfinished = lines.pop().is_some_and(|rest| !rest.is_empty());
    let Some((first, rest)) = lines.split_first() else {
        return corrupt(None, "the journal has no header");
    };
    let Some(header) = decode_line::<Header>(first) else {
        return corrupt(None, "the journal's header fails its checksum");
    };
    if header.journal != VERSION {
        return corrupt(None, format!("unknown journal version {}", header.journal));
    }
    let mut state = Snapshot::default();
    let mut torn = unfinished;
    for (i, raw) in rest.iter().enumerate() {
        match decode_line::<Vec<Record>>(raw) {
            Some(batch) => batch.into_iter().for_each(|r| state.apply(r)),
            None if i + 1 == rest.len() && !unfinished => torn = true,
            None => {
                return corrupt(
                    Some(header.owner),
                    format!("batch {} of the journal fails its checksum", i + 1),
                );
            }
        }
    }
    Replay::Intact {
        owner: header.owner,
        state,
        torn,
        disposing: header.disposing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::journal::StateDir;
    use crate::memory::journal::format::MapKind;
    use crate::memory::journal::tests::{bytes, intact, journal, owner, state};

    #[test]
    fn a_snapshot_and_its_appends_replay_to_the_same_state() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        j.append(&[
            Record(MapKind::Baseline, Some("new.md".into()), Some("nn".into())),
            Record(MapKind::Baseline, Some("a.md".into()), None),
            Record(MapKind::Sent, None, None),
        ])
        .unwrap();
        let mut want = state();
        want.baseline.insert("new.md".into(), "nn".into());
        want.baseline.remove("a.md");
        want.sent.clear();
        match replay(&bytes(&dir)) {
            Replay::Intact {
                owner: found,
                state,
                torn,
                disposing,
            } => {
                assert_eq!(found, owner());
                assert_eq!(state, want);
                assert!(!torn && !disposing);
            }
            Replay::Corrupt { reason, .. } => panic!("corrupt: {reason}"),
        }
    }

    #[test]
    fn a_torn_last_record_is_dropped_and_the_rest_stands() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        j.append(&[Record(
            MapKind::Baseline,
            Some("new.md".into()),
            Some("nn".into()),
        )])
        .unwrap();
        let full = bytes(&dir);
        // Every cut inside the last record: unfinished, or (cut right
        // before its newline) finished with a failing checksum.
        let last_start = full[..full.len() - 1]
            .iter()
            .rposition(|b| *b == b'\n')
            .unwrap()
            + 1;
        for cut in last_start + 1..full.len() {
            let (got, torn) = intact(replay(&full[..cut]));
            assert_eq!(got, state(), "cut at {cut}");
            assert!(torn, "cut at {cut}");
        }
        // A flipped bit in the last record: torn, too.
        let mut flipped = full.clone();
        flipped[full.len() - 3] ^= 1;
        let (got, torn) = intact(replay(&flipped));
        assert_eq!(got, state());
        assert!(torn);
    }

    #[test]
    fn damage_before_the_last_record_or_in_the_header_is_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        journal(&dir);
        let full = bytes(&dir);
        // A flipped byte in the header: nothing can be trusted.
        let header_end = full.iter().position(|b| *b == b'\n').unwrap();
        let mut bad = full.clone();
        bad[12] ^= 0x20;
        assert_eq!(
            replay(&bad),
            Replay::Corrupt {
                owner: None,
                reason: "the journal's header fails its checksum".into()
            }
        );
        // In the first batch (others follow): corrupt, the owner still known.
        let mut bad = full.clone();
        bad[header_end + 12] ^= 0x20;
        assert!(
            matches!(replay(&bad), Replay::Corrupt { owner: Some(o), .. } if o == owner()),
            "a flipped byte in a middle batch must be caught"
        );
        assert!(matches!(replay(b""), Replay::Corrupt { owner: None, .. }));
        assert!(matches!(
            replay(b"garbage"),
            Replay::Corrupt { owner: None, .. }
        ));
    }

    #[test]
    fn a_batch_applies_whole_or_not_at_all() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(&tmp.path().join("state")).unwrap();
        let mut j = journal(&dir);
        // The re-download's first batch: the baseline moves to tentative.
        j.append(&[
            Record(MapKind::Baseline, None, None),
            Record(MapKind::Tentative, Some("a.md".into()), Some("aa".into())),
        ])
        .unwrap();
        let full = bytes(&dir);
        let (got, _) = intact(replay(&full[..full.len() - 20]));
        assert_eq!(
            got,
            state(),
            "a torn batch: none of it, not the clear alone"
        );
        let (got, _) = intact(replay(&full));
        assert!(got.baseline.is_empty() && got.tentative.contains_key("a.md"));
    }
}
