//! The API's input rules, as pure functions. Each returns the message the
//! devserver sends back in a 400 `invalid_request_error`.

use std::collections::BTreeMap;

use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::is_nfc;

pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_PATH_SEGMENTS: usize = 20;
pub const MAX_CONTENT_BYTES: usize = 102_400;
pub const MAX_MEMORIES_PER_STORE: u64 = 2_000;
pub const MAX_NAME_CHARS: usize = 255;
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

/// Control characters (Cc), format characters (Cf) and the line and
/// paragraph separators are refused in paths.
fn is_forbidden_in_path(c: char) -> bool {
    c.is_control()
        || matches!(
            get_general_category(c),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        )
}

/// A memory path: starts with `/`, 1 to 20 segments, no empty, `.` or `..`
/// segment, no control or format characters, NFC, at most 1,024 bytes.
pub fn memory_path(field: &str, path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("{field}: must not be empty"));
    }
    if !path.starts_with('/') {
        return Err(format!("{field}: must start with '/'"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "{field}: is {} bytes long; the limit is {MAX_PATH_BYTES} bytes",
            path.len()
        ));
    }
    if path.chars().any(is_forbidden_in_path) {
        return Err(format!(
            "{field}: must not contain control characters, format characters, or U+2028/U+2029"
        ));
    }
    if !is_nfc(path) {
        return Err(format!(
            "{field}: must be in Unicode Normalization Form C (NFC)"
        ));
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    if segments.len() > MAX_PATH_SEGMENTS {
        return Err(format!(
            "{field}: has {} segments; the limit is {MAX_PATH_SEGMENTS}",
            segments.len()
        ));
    }
    for segment in segments {
        match segment {
            "" => return Err(format!("{field}: must not contain an empty segment")),
            "." | ".." => {
                return Err(format!("{field}: must not contain a '.' or '..' segment"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A `path_prefix`: `/`, or a valid path followed by `/` (segment aligned).
pub fn path_prefix(prefix: &str) -> Result<(), String> {
    if prefix == "/" {
        return Ok(());
    }
    if !prefix.ends_with('/') {
        return Err("path_prefix: must end with '/'".into());
    }
    memory_path("path_prefix", &prefix[..prefix.len() - 1])
}

/// Memory content: at most 102,400 bytes (UTF-8 is guaranteed by JSON decoding).
pub fn content(content: &str) -> Result<(), String> {
    if content.len() > MAX_CONTENT_BYTES {
        return Err(format!(
            "content: is {} bytes long; the limit is {MAX_CONTENT_BYTES} bytes",
            content.len()
        ));
    }
    Ok(())
}

/// A store name: 1 to 255 characters without control characters.
pub fn store_name(name: &str) -> Result<(), String> {
    let chars = name.chars().count();
    if chars == 0 {
        return Err("name: must not be empty".into());
    }
    if chars > MAX_NAME_CHARS {
        return Err(format!(
            "name: is {chars} characters long; the limit is {MAX_NAME_CHARS}"
        ));
    }
    if name.chars().any(char::is_control) {
        return Err("name: must not contain control characters".into());
    }
    Ok(())
}

/// A store description: at most 1,024 characters.
pub fn description(description: &str) -> Result<(), String> {
    let chars = description.chars().count();
    if chars > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "description: is {chars} characters long; the limit is {MAX_DESCRIPTION_CHARS}"
        ));
    }
    Ok(())
}

/// Metadata after a patch: at most 16 pairs, keys 1–64 characters, values at
/// most 512 characters.
pub fn metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    if metadata.len() > MAX_METADATA_PAIRS {
        return Err(format!(
            "metadata: has {} pairs; the limit is {MAX_METADATA_PAIRS}",
            metadata.len()
        ));
    }
    for (key, value) in metadata {
        let key_chars = key.chars().count();
        if key_chars == 0 || key_chars > MAX_METADATA_KEY_CHARS {
            return Err(format!(
                "metadata: keys must be 1 to {MAX_METADATA_KEY_CHARS} characters long"
            ));
        }
        if value.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(format!(
                "metadata: the value of {key:?} is longer than {MAX_METADATA_VALUE_CHARS} characters"
            ));
        }
    }
    Ok(())
}

/// A SHA-256 given by a client: 64 lowercase hexadecimal characters.
pub fn sha256_hex(field: &str, sha: &str) -> Result<(), String> {
    if sha.len() == 64 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(format!(
            "{field}: must be 64 lowercase hexadecimal characters"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_paths() {
        let long_ok = format!("/{}", "a".repeat(MAX_PATH_BYTES - 1));
        let long_bad = format!("/{}", "a".repeat(MAX_PATH_BYTES));
        let twenty = "/s".repeat(20);
        let twenty_one = "/s".repeat(21);
        let table: &[(&str, bool)] = &[
            ("/a.md", true),
            ("/projects/foo/notes.md", true),
            ("/Ünïcödé/ñ.md", true),
            ("/with space/and-dash_.md", true),
            ("/CaseSensitive.md", true),
            (&long_ok, true),
            (&twenty, true),
            ("", false),
            ("a.md", false),
            ("/", false),
            ("//a", false),
            ("/a//b", false),
            ("/a/", false),
            ("/./a", false),
            ("/a/..", false),
            ("/../etc/passwd", false),
            ("/a\u{0}b", false),
            ("/a\nb", false),
            ("/a\u{7f}", false),
            ("/zero\u{200b}width", false),
            ("/bom\u{feff}", false),
            ("/line\u{2028}sep", false),
            ("/para\u{2029}sep", false),
            ("/cafe\u{301}.md", false), // decomposed é: not NFC
            (&long_bad, false),
            (&twenty_one, false),
        ];
        for (path, ok) in table {
            assert_eq!(memory_path("path", path).is_ok(), *ok, "{path:?}");
        }
    }

    #[test]
    fn path_prefixes() {
        for ok in ["/", "/notes/", "/a/b/"] {
            assert!(path_prefix(ok).is_ok(), "{ok}");
        }
        for bad in ["", "notes/", "/notes", "//", "/a//", "/../", "/./"] {
            assert!(path_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn content_limit_is_in_bytes() {
        assert!(content(&"a".repeat(MAX_CONTENT_BYTES)).is_ok());
        assert!(content(&"a".repeat(MAX_CONTENT_BYTES + 1)).is_err());
        // 2-byte characters: 51,201 of them are 102,402 bytes.
        assert!(content(&"é".repeat(51_201)).is_err());
        assert!(content("").is_ok());
    }

    #[test]
    fn names_descriptions_metadata() {
        assert!(store_name("User Preferences").is_ok());
        assert!(store_name(&"x".repeat(255)).is_ok());
        assert!(
            store_name(&"é".repeat(255)).is_ok(),
            "characters, not bytes"
        );
        assert!(store_name("").is_err());
        assert!(store_name(&"x".repeat(256)).is_err());
        assert!(store_name("tab\there").is_err());
        assert!(description(&"d".repeat(1024)).is_ok());
        assert!(description(&"d".repeat(1025)).is_err());

        let pairs = |n: usize| -> BTreeMap<String, String> {
            (0..n).map(|i| (format!("k{i}"), "v".into())).collect()
        };
        assert!(metadata(&pairs(16)).is_ok());
        assert!(metadata(&pairs(17)).is_err());
        assert!(metadata(&BTreeMap::from([("".into(), "v".into())])).is_err());
        assert!(metadata(&BTreeMap::from([("k".repeat(65), "v".into())])).is_err());
        assert!(metadata(&BTreeMap::from([("k".into(), "v".repeat(513))])).is_err());
        assert!(metadata(&BTreeMap::from([("k".into(), "v".repeat(512))])).is_ok());
    }

    #[test]
    fn sha256_hex_format() {
        assert!(sha256_hex("x", &"a".repeat(64)).is_ok());
        assert!(sha256_hex("x", &"A".repeat(64)).is_err());
        assert!(sha256_hex("x", &"a".repeat(63)).is_err());
        assert!(sha256_hex("x", &"g".repeat(64)).is_err());
    }
}
