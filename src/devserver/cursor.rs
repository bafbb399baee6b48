//! List pagination: opaque page cursors (`page_<base64url(JSON)>`) and the
//! one function that builds a page, `{data, next_page}`.
//!
//! Every list endpoint pages the same way: it asks the database for
//! [`fetch_limit`]`(limit)` rows, one more than it answers, and hands them to
//! [`page`]. That extra row is how a page knows there is a next one without
//! a second query: when it came, it is dropped and `next_page` is the cursor
//! of the last row kept; when it did not, this is the last page and
//! `next_page` is `null`. Most lists are `(seq, item)` rows newest first,
//! paged by [`newest_first`]; the others (sessions and their events in either
//! order, skill versions, memories in path order) name their own position.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::types::Page;

use super::error::{HttpError, HttpResult};

/// The position in a newest-first listing: the key of the last item returned.
#[derive(Debug, Serialize, Deserialize)]
pub struct Before {
    pub before: i64,
}

pub fn encode<T: Serialize>(position: &T) -> String {
    let json = serde_json::to_vec(position).unwrap_or_default();
    format!("page_{}", URL_SAFE_NO_PAD.encode(json))
}

/// Decode the `page` query parameter; anything this server did not issue is a 400.
pub fn decode<T: DeserializeOwned>(page: Option<&str>) -> HttpResult<Option<T>> {
    let Some(page) = page.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let invalid = || HttpError::invalid_request("page: not a valid page cursor");
    let encoded = page.strip_prefix("page_").ok_or_else(invalid)?;
    let json = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| invalid())?;
    serde_json::from_slice(&json)
        .map(Some)
        .map_err(|_| invalid())
}

/// How many rows a list query asks for to answer `limit` items: one more,
/// which tells [`page`] whether a next page exists.
pub fn fetch_limit(limit: usize) -> i64 {
    (limit + 1) as i64
}

/// The page of `rows` (fetched with [`fetch_limit`]`(limit)`, in the listing's
/// order): at most `limit` items, each made by `item`, and the cursor of the
/// next page — `position` of the last row kept, encoded — when rows remain.
pub fn page<R, T, P: Serialize>(
    mut rows: Vec<R>,
    limit: usize,
    position: impl FnOnce(&R) -> P,
    item: impl FnMut(R) -> T,
) -> Page<T> {
    let next_page = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|last| encode(&position(last)))
    } else {
        None
    };
    Page {
        data: rows.into_iter().map(item).collect(),
        next_page,
    }
}

/// The page of `(seq, item)` rows listed newest first (`seq < before`,
/// `ORDER BY seq DESC`): the next page starts before the last `seq` kept.
pub fn newest_first<T>(rows: Vec<(i64, T)>, limit: usize) -> Page<T> {
    page(
        rows,
        limit,
        |(seq, _)| Before { before: *seq },
        |(_, item)| item,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_limit_rows_and_points_after_the_last() {
        let before = |r: &(i64, &str)| Before { before: r.0 };
        let item = |r: (i64, &str)| r.1.to_string();
        let rows = vec![(9, "a"), (8, "b"), (7, "c")];
        let full = page(rows.clone(), 2, before, item);
        assert_eq!(full.data, ["a", "b"]);
        let next: Option<Before> = decode(full.next_page.as_deref()).unwrap();
        assert_eq!(next.unwrap().before, 8, "the cursor is the last row kept");
        let last = page(rows, 3, before, item);
        assert_eq!(last.data, ["a", "b", "c"]);
        assert_eq!(last.next_page, None, "no extra row: the last page");
        let empty = page(Vec::new(), 3, before, item);
        assert!(empty.data.is_empty() && empty.next_page.is_none());
        assert_eq!(fetch_limit(20), 21);
    }

    #[test]
    fn round_trip_and_garbage() {
        let c = encode(&("after", "/a/b.md"));
        assert!(c.starts_with("page_"));
        let back: Option<(String, String)> = decode(Some(&c)).unwrap();
        assert_eq!(back.unwrap().1, "/a/b.md");
        assert!(decode::<i64>(None).unwrap().is_none());
        assert!(decode::<i64>(Some("")).unwrap().is_none());
        assert!(decode::<i64>(Some("page_!!")).is_err());
        assert!(decode::<i64>(Some("nope")).is_err());
    }
}
