//! The most bytes a memory may hold, and what the folder does with a file
//! over it: decided by `fstat`, never read whole, scanned as a stand-in
//! hash made from its stat (so it changes whenever the file does), and
//! refused by [`Folder::get`](super::Folder::get).

use super::stat::stat_key;

/// The most bytes a memory may hold: the API's limit on one memory's content
/// (`102_400`). A larger file is decided by `fstat` and never read whole, so
/// no file's size can drive the worker's memory use.
pub(crate) const MAX_FILE_BYTES: u64 = 102_400;

/// The prefix of an oversized file's stand-in hash; see [`is_oversized`].
const OVERSIZED: &str = "oversized:";

/// Is this scanned hash the stand-in of a file over [`MAX_FILE_BYTES`]? A
/// stand-in is made from the file's stat (size, times, inode), so it changes
/// whenever the file does, and it never equals a content hash.
pub(crate) fn is_oversized(sha: &str) -> bool {
    sha.starts_with(OVERSIZED)
}

/// The size an oversized file's stand-in hash records ([`is_oversized`]).
pub(crate) fn oversized_bytes(sha: &str) -> Option<u64> {
    sha.strip_prefix(OVERSIZED)?.split(':').next()?.parse().ok()
}

pub(super) fn stand_in(st: &rustix::fs::Stat) -> String {
    let k = stat_key(st);
    format!(
        "{OVERSIZED}{}:{}:{}:{}",
        k.size, k.mtime_ns, k.ctime_ns, k.ino
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::folder::FolderError;
    use crate::memory::folder::tests::folder;
    use sha2::{Digest, Sha256};

    #[test]
    fn oversized_files_are_decided_by_stat_and_never_read_whole() {
        let (_t, f) = folder();
        let path = f.root().join("big.md");
        // Sparse: no disk, and a read of it would show in the test's memory.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(64 << 30)
            .unwrap();
        let scan = f.scan().unwrap();
        assert!(is_oversized(&scan.files["big.md"]), "{scan:?}");
        assert!(is_oversized(&f.hash_file("big.md").unwrap().unwrap()));
        assert!(matches!(
            f.get("big.md"),
            Err(FolderError::TooLarge { size, .. }) if size == 64 << 30
        ));
        assert!(f.get("big.md").unwrap_err().is_refusal());
        // The stand-in changes with the file; at the limit a file is hashed.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let again = f.scan().unwrap().files["big.md"].clone();
        assert!(is_oversized(&again) && again != scan.files["big.md"]);
        std::fs::write(&path, "x".repeat(MAX_FILE_BYTES as usize)).unwrap();
        assert_eq!(
            f.scan().unwrap().files["big.md"],
            hex::encode(Sha256::digest("x".repeat(MAX_FILE_BYTES as usize)))
        );
        assert_eq!(
            f.get("big.md").unwrap().unwrap().len() as u64,
            MAX_FILE_BYTES
        );
    }
}
