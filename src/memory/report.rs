//! What a sync did: one report type for one store's pass and for a sync
//! of every store (the passes' reports summed).

/// What a sync did: one store's pass, or every store's summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    pub uploads: usize,
    pub(crate) pulls: usize,
    pub(crate) deletes: usize,
    pub(crate) deletes_held: usize,
    pub(crate) deletes_logged: usize,
    /// Remote changes that beat a local one (the local edit lost).
    pub(crate) conflicts: usize,
    /// Files the server refused (400/413); each counts once until its
    /// content changes.
    pub(crate) refused: usize,
    /// Stores whose folder was recovered (re-downloaded) by the pass.
    pub(crate) recovered: usize,
    /// Entries of the folders stat-ed by the passes' scans: the files the
    /// watch reported, or every file for a full scan.
    pub examined: usize,
    /// Stores whose pass scanned the whole folder.
    pub full_scans: usize,
    /// Uploads the change-driven push made since the previous sync.
    pub pushed: usize,
}

impl SyncReport {
    /// Count `other`'s work in too.
    pub(crate) fn add(&mut self, other: &SyncReport) {
        let SyncReport {
            uploads,
            pulls,
            deletes,
            deletes_held,
            deletes_logged,
            conflicts,
            refused,
            recovered,
            examined,
            full_scans,
            pushed,
        } = *other;
        self.uploads += uploads;
        self.pulls += pulls;
        self.deletes += deletes;
        self.deletes_held += deletes_held;
        self.deletes_logged += deletes_logged;
        self.conflicts += conflicts;
        self.refused += refused;
        self.recovered += recovered;
        self.examined += examined;
        self.full_scans += full_scans;
        self.pushed += pushed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter is summed (the destructuring in `add` makes a new
    /// field a compile error until it is summed too).
    #[test]
    fn adding_sums_every_counter() {
        let one = SyncReport {
            uploads: 1,
            pulls: 2,
            deletes: 3,
            deletes_held: 4,
            deletes_logged: 5,
            conflicts: 6,
            refused: 7,
            recovered: 1,
            examined: 9,
            full_scans: 1,
            pushed: 11,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(
            sum,
            SyncReport {
                uploads: 2,
                pulls: 4,
                deletes: 6,
                deletes_held: 8,
                deletes_logged: 10,
                conflicts: 12,
                refused: 14,
                recovered: 2,
                examined: 18,
                full_scans: 2,
                pushed: 22,
            }
        );
    }
}
