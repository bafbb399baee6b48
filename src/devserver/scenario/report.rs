//! The report of a scripted session, as `GET /dev/scenarios/{session_id}`
//! answers it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `running` until the work item stopped after the last step (or a step
/// failed for good); then `passed` or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    Running,
    Passed,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Running,
    Passed,
    Failed,
    Skipped,
}

/// What happened at one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    pub(crate) index: usize,
    /// `tool`, `custom_tool`, `remote` or `wait`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) is_error: Option<bool>,
    /// The result's text, truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<String>,
    /// From the `agent.tool_use` being recorded to its result being recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) latency_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
}

/// A store of the scenario as created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreInfo {
    pub(crate) memory_store_id: String,
    pub(crate) mount_path: String,
    pub(crate) access: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub(crate) session_id: String,
    pub(crate) environment_id: String,
    pub(crate) name: String,
    pub status: ReportStatus,
    pub(crate) stores: BTreeMap<String, StoreInfo>,
    pub(crate) steps: Vec<StepOutcome>,
    /// Every store's complete contents once the work item stopped.
    pub(crate) final_contents: Option<BTreeMap<String, BTreeMap<String, String>>>,
    /// Every expectation that failed, readable; empty when passed.
    pub(crate) failures: Vec<String>,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
}

/// Longest result text kept in a step outcome.
pub const OUTPUT_CHARS: usize = 2_000;

pub fn truncate(text: &str) -> String {
    if text.chars().count() <= OUTPUT_CHARS {
        text.to_string()
    } else {
        let mut t: String = text.chars().take(OUTPUT_CHARS).collect();
        t.push_str("…[truncated]");
        t
    }
}

/// Readable differences between the expected and the actual contents of one
/// store; empty when they are equal.
pub fn diff_store(
    key: &str,
    expected: &BTreeMap<String, String>,
    actual: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (path, want) in expected {
        match actual.get(path) {
            None => out.push(format!(
                "store {key}: {path} is missing (expected {:?})",
                truncate(want)
            )),
            Some(got) if got != want => out.push(format!(
                "store {key}: {path} holds {:?}, expected {:?}",
                truncate(got),
                truncate(want)
            )),
            Some(_) => {}
        }
    }
    for (path, got) in actual {
        if !expected.contains_key(path) {
            out.push(format!(
                "store {key}: {path} is not expected (it holds {:?})",
                truncate(got)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_differences_are_readable() {
        let want = BTreeMap::from([
            ("/a.md".to_string(), "A".to_string()),
            ("/b.md".to_string(), "B".to_string()),
        ]);
        let got = BTreeMap::from([
            ("/a.md".to_string(), "a".to_string()),
            ("/c.md".to_string(), "C".to_string()),
        ]);
        let diff = diff_store("prefs", &want, &got);
        assert_eq!(
            diff,
            vec![
                r#"store prefs: /a.md holds "a", expected "A""#,
                r#"store prefs: /b.md is missing (expected "B")"#,
                r#"store prefs: /c.md is not expected (it holds "C")"#,
            ]
        );
        assert!(diff_store("prefs", &want, &want).is_empty());
    }
}
