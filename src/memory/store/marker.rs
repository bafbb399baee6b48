//! The marker: the file at a store folder's root that names the store, and
//! the one rule that trusts a folder by it. A folder whose marker is gone
//! or names another store is never pushed from nor deleted from.

use super::sha256_hex;
use crate::memory::folder::{Folder, MARKER_PATH};

const MARKER_VERSION: u32 = 1;

/// What the marker of store `store_id` holds.
pub(crate) fn marker_content(store_id: &str) -> String {
    format!("version {MARKER_VERSION}\n{store_id}")
}

fn marker_sha(store_id: &str) -> String {
    sha256_hex(marker_content(store_id).as_bytes())
}

/// The one marker check: does the marker found at a store folder (its
/// hash, `None` when there is none) name the store `store_id`? `None` when
/// it does; otherwise why not, in words fit for the log. The scan and the
/// second phase of a local deletion both ask it, so a folder is trusted by
/// one rule.
pub(super) fn marker_distrust(found: Option<&str>, store_id: &str) -> Option<&'static str> {
    match found {
        Some(sha) if sha == marker_sha(store_id) => None,
        Some(_) => Some("the marker file does not match this store"),
        None => Some("the marker file is gone"),
    }
}

/// Does the marker in `folder` name the store `store_id`? (Read now.)
pub(crate) fn marks_store(folder: &Folder, store_id: &str) -> bool {
    matches!(folder.hash_file(MARKER_PATH), Ok(found) if marker_distrust(found.as_deref(), store_id).is_none())
}
