//! The scenario file (version 1): stores to create and attach, the steps the
//! scripted "agent" takes, and the stores' expected final contents.
//!
//! ```json
//! {"name": "…", "environment_id": "env_… (optional)",
//!  "memory_stores": [{"key": "prefs", "name": "User Preferences", "access": "read_write",
//!                     "memories": {"/style.md": "…"}}],
//!  "steps": [{"tool": "read", "input": {"file_path": "{mount:prefs}/style.md"},
//!             "expect": {"is_error": false, "contains": "short"}},
//!            {"remote": {"op": "update", "store": "prefs", "path": "/style.md", "content": "…"}},
//!            {"wait_ms": 500},
//!            {"tool": "bash", "input": {"command": "ls"}, "evaluated_permission": "ask", "confirm": "allow"}],
//!  "expect_final": {"prefs": {"/style.md": "…"}}}
//! ```
//!
//! Extensions beyond version 1 (none renames a field): `custom_tool` steps
//! (an `agent.custom_tool_use`), `remote.op` `rename` (with `new_path`), a
//! per-step `timeout_ms`, store `description` and `instructions`, an
//! optional `agent` (tools, skills) for the session, and a
//! `{"terminate": true}` step that ends the session.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;

use crate::api::types::Access;

use super::super::validate;

/// Why a scenario was refused; the message names the step or store.
pub type FormatError = String;

/// Steps in one scenario.
pub const MAX_STEPS: usize = 1_000;
/// A `wait_ms` step waits at most this long (10 minutes).
pub const MAX_WAIT_MS: u64 = 600_000;
/// A step's `timeout_ms` is 1 ms to this (an hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Memories seeded across all of a scenario's stores.
pub const MAX_MEMORIES: usize = 2_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub environment_id: Option<String>,
    #[serde(default)]
    pub agent: Option<Value>,
    #[serde(default)]
    pub(crate) memory_stores: Vec<StoreSpec>,
    #[serde(default)]
    pub(crate) steps: Vec<Value>,
    #[serde(default)]
    pub(crate) expect_final: Option<BTreeMap<String, BTreeMap<String, String>>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSpec {
    pub(crate) key: String,
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) access: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub(crate) memories: BTreeMap<String, String>,
}

impl StoreSpec {
    pub fn access(&self) -> Access {
        self.access
            .as_deref()
            .and_then(Access::parse)
            .unwrap_or(Access::ReadWrite)
    }
}

/// What the result of a tool call must look like.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub(crate) is_error: Option<bool>,
    #[serde(default)]
    pub(crate) contains: Option<OneOrMany>,
    #[serde(default)]
    pub(crate) not_contains: Option<OneOrMany>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(s) => vec![s.as_str()],
            OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// A tool call the agent makes.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolStep {
    pub(crate) name: String,
    pub(crate) custom: bool,
    pub(crate) input: Value,
    pub(crate) expect: Expect,
    /// `allow`, `ask` or `deny` as the server evaluated it; `None` = allow.
    pub(crate) evaluated_permission: Option<String>,
    /// The user's verdict on an `ask` call.
    pub(crate) confirm: Option<String>,
    pub(crate) timeout_ms: Option<u64>,
}

/// A change made through the API, as an organisation key would.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteOp {
    pub(crate) op: String,
    pub(crate) store: String,
    pub(crate) path: String,
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) new_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Tool(ToolStep),
    Remote(RemoteOp),
    Wait(u64),
    /// End the session (`session.status_terminated`); later steps are skipped.
    Terminate,
}

impl Step {
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Tool(t) if t.custom => "custom_tool",
            Step::Tool(_) => "tool",
            Step::Remote(_) => "remote",
            Step::Wait(_) => "wait",
            Step::Terminate => "terminate",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolStep {
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    custom_tool: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    expect: Option<Expect>,
    #[serde(default)]
    evaluated_permission: Option<String>,
    #[serde(default)]
    confirm: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    remote: RemoteOp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWait {
    wait_ms: u64,
}

fn step_error(index: usize, message: impl std::fmt::Display) -> FormatError {
    format!("steps[{index}]: {message}")
}

fn parse_step(index: usize, raw: &Value, stores: &BTreeSet<&str>) -> Result<Step, FormatError> {
    let obj = raw
        .as_object()
        .ok_or_else(|| step_error(index, "a step must be an object"))?;
    if obj.contains_key("remote") {
        let r: RawRemote = serde_json::from_value(raw.clone()).map_err(|e| step_error(index, e))?;
        let op = r.remote;
        if !stores.contains(op.store.as_str()) {
            return Err(step_error(
                index,
                format!(
                    "remote.store {:?} is not a store of this scenario",
                    op.store
                ),
            ));
        }
        validate::memory_path("remote.path", &op.path).map_err(|e| step_error(index, e))?;
        match op.op.as_str() {
            "create" | "update" => {
                let content = op
                    .content
                    .as_deref()
                    .ok_or_else(|| step_error(index, format!("remote.{} needs content", op.op)))?;
                validate::content(content).map_err(|e| step_error(index, e))?;
            }
            "delete" => {}
            "rename" => {
                let to = op
                    .new_path
                    .as_deref()
                    .ok_or_else(|| step_error(index, "remote.rename needs new_path"))?;
                validate::memory_path("remote.new_path", to).map_err(|e| step_error(index, e))?;
            }
            other => {
                return Err(step_error(
                    index,
                    format!("remote.op {other:?} is not create, update, delete or rename"),
                ));
            }
        }
        return Ok(Step::Remote(op));
    }
    if obj.contains_key("terminate") {
        if obj.len() != 1 || obj["terminate"] != Value::Bool(true) {
            return Err(step_error(
                index,
                "a terminate step is exactly {\"terminate\": true}",
            ));
        }
        return Ok(Step::Terminate);
    }
    if obj.contains_key("wait_ms") {
        let w: RawWait = serde_json::from_value(raw.clone()).map_err(|e| step_error(index, e))?;
        if w.wait_ms > MAX_WAIT_MS {
            return Err(step_error(
                index,
                format!(
                    "wait_ms is {}; the most a step waits is {MAX_WAIT_MS} (10 minutes)",
                    w.wait_ms
                ),
            ));
        }
        return Ok(Step::Wait(w.wait_ms));
    }
    if obj.contains_key("tool") || obj.contains_key("custom_tool") {
        let t: RawToolStep =
            serde_json::from_value(raw.clone()).map_err(|e| step_error(index, e))?;
        let (name, custom) = match (t.tool, t.custom_tool) {
            (Some(n), None) => (n, false),
            (None, Some(n)) => (n, true),
            _ => {
                return Err(step_error(
                    index,
                    "give either tool or custom_tool, not both",
                ));
            }
        };
        if name.is_empty() {
            return Err(step_error(index, "the tool name is empty"));
        }
        let input = t.input.unwrap_or_else(|| Value::Object(Default::default()));
        if !input.is_object() {
            return Err(step_error(index, "input must be an object"));
        }
        if let Some(p) = &t.evaluated_permission
            && !matches!(p.as_str(), "allow" | "ask" | "deny")
        {
            return Err(step_error(
                index,
                "evaluated_permission must be allow, ask or deny",
            ));
        }
        if let Some(p) = &t.evaluated_permission
            && p != "allow"
            && custom
        {
            return Err(step_error(index, "a custom tool call cannot be gated"));
        }
        match (t.evaluated_permission.as_deref(), t.confirm.as_deref()) {
            (Some("ask"), Some("allow" | "deny")) => {}
            (Some("ask"), _) => {
                return Err(step_error(
                    index,
                    "an ask-gated call needs confirm: allow or deny",
                ));
            }
            (_, Some(_)) => {
                return Err(step_error(
                    index,
                    "confirm only goes with evaluated_permission: ask",
                ));
            }
            _ => {}
        }
        if let Some(ms) = t.timeout_ms
            && !(1..=MAX_TIMEOUT_MS).contains(&ms)
        {
            return Err(step_error(
                index,
                format!("timeout_ms is {ms}; it must be between 1 and {MAX_TIMEOUT_MS} (an hour)"),
            ));
        }
        let expect = t.expect.unwrap_or_default();
        let expect_strings: Vec<Value> = [&expect.contains, &expect.not_contains]
            .into_iter()
            .flatten()
            .flat_map(|m| m.items().into_iter().map(|s| Value::String(s.to_string())))
            .collect();
        for key in mount_refs(&input)
            .into_iter()
            .chain(expect_strings.iter().flat_map(mount_refs))
        {
            if !stores.contains(key.as_str()) {
                return Err(step_error(
                    index,
                    format!("{{mount:{key}}} names no store of this scenario"),
                ));
            }
        }
        return Ok(Step::Tool(ToolStep {
            name,
            custom,
            input,
            expect,
            evaluated_permission: t.evaluated_permission,
            confirm: t.confirm,
            timeout_ms: t.timeout_ms,
        }));
    }
    Err(step_error(
        index,
        "a step is a tool, custom_tool, remote, wait_ms or terminate step",
    ))
}

/// The store keys named by `{mount:KEY}` anywhere in `value`.
fn mount_refs(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut visit = vec![value];
    while let Some(v) = visit.pop() {
        match v {
            Value::String(s) => {
                let mut rest = s.as_str();
                while let Some(start) = rest.find("{mount:") {
                    let after = &rest[start + 7..];
                    match after.find('}') {
                        Some(end) => {
                            out.push(after[..end].to_string());
                            rest = &after[end + 1..];
                        }
                        None => break,
                    }
                }
            }
            Value::Array(items) => visit.extend(items),
            Value::Object(map) => visit.extend(map.values()),
            _ => {}
        }
    }
    out
}

/// Replace every `{mount:KEY}` in the strings of `value`.
pub fn substitute(value: &Value, mounts: &BTreeMap<String, String>) -> Value {
    match value {
        Value::String(s) => Value::String(substitute_str(s, mounts)),
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, mounts)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute(v, mounts)))
                .collect(),
        ),
        other => other.clone(),
    }
}

pub fn substitute_str(s: &str, mounts: &BTreeMap<String, String>) -> String {
    let mut out = s.to_string();
    for (key, path) in mounts {
        out = out.replace(&format!("{{mount:{key}}}"), path);
    }
    out
}

/// A checked scenario.
#[derive(Debug, Clone)]
pub struct Checked {
    pub(crate) scenario: Scenario,
    pub(crate) steps: Vec<Step>,
}

/// Parse and check a scenario document.
pub fn parse(doc: Value) -> Result<Checked, FormatError> {
    let scenario: Scenario = serde_json::from_value(doc).map_err(|e| format!("scenario: {e}"))?;
    let mut keys = BTreeSet::new();
    if scenario.steps.len() > MAX_STEPS {
        return Err(format!(
            "steps: {} steps; a scenario has at most {MAX_STEPS}",
            scenario.steps.len()
        ));
    }
    let memories: usize = scenario
        .memory_stores
        .iter()
        .map(|s| s.memories.len())
        .sum();
    if memories > MAX_MEMORIES {
        return Err(format!(
            "memory_stores: {memories} memories; a scenario seeds at most {MAX_MEMORIES}"
        ));
    }
    if scenario.memory_stores.len() > super::super::sessions::MAX_MEMORY_STORES {
        return Err(format!(
            "memory_stores: at most {} stores can be attached to a session",
            super::super::sessions::MAX_MEMORY_STORES
        ));
    }
    for (i, store) in scenario.memory_stores.iter().enumerate() {
        if store.key.is_empty() || !keys.insert(store.key.as_str()) {
            return Err(format!(
                "memory_stores[{i}]: key must be non-empty and unique"
            ));
        }
        validate::store_name(&store.name).map_err(|e| format!("memory_stores[{i}]: {e}"))?;
        if let Some(a) = &store.access
            && Access::parse(a).is_none()
        {
            return Err(format!(
                "memory_stores[{i}]: access must be read_write or read_only"
            ));
        }
        for (path, content) in &store.memories {
            validate::memory_path("path", path)
                .map_err(|e| format!("memory_stores[{i}].memories: {e}"))?;
            validate::content(content)
                .map_err(|e| format!("memory_stores[{i}].memories[{path:?}]: {e}"))?;
        }
    }
    let steps = scenario
        .steps
        .iter()
        .enumerate()
        .map(|(i, raw)| parse_step(i, raw, &keys))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(expect) = &scenario.expect_final {
        for (key, memories) in expect {
            if !keys.contains(key.as_str()) {
                return Err(format!(
                    "expect_final: {key:?} is not a store of this scenario"
                ));
            }
            for path in memories.keys() {
                validate::memory_path("path", path)
                    .map_err(|e| format!("expect_final.{key}: {e}"))?;
            }
        }
    }
    Ok(Checked { scenario, steps })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn design_example() -> Value {
        json!({
          "name": "notes-roundtrip",
          "memory_stores": [
            {"key": "prefs", "name": "User Preferences", "access": "read_write",
             "memories": {"/style.md": "Prefer short answers.\n"}},
            {"key": "kb", "name": "Team KB", "access": "read_only", "memories": {"/faq.md": "Q: …\n"}}
          ],
          "steps": [
            {"tool": "read", "input": {"file_path": "{mount:prefs}/style.md"},
             "expect": {"is_error": false, "contains": "short"}},
            {"tool": "write", "input": {"file_path": "{mount:kb}/x.md", "content": "no"},
             "expect": {"is_error": true}},
            {"remote": {"op": "update", "store": "prefs", "path": "/style.md", "content": "Be brief.\n"}},
            {"wait_ms": 500},
            {"tool": "bash", "input": {"command": "ls {mount:prefs}"},
             "evaluated_permission": "ask", "confirm": "allow"}
          ],
          "expect_final": {"prefs": {"/style.md": "Be brief.\n"}, "kb": {"/faq.md": "Q: …\n"}}
        })
    }

    #[test]
    fn the_design_example_parses() {
        let checked = parse(design_example()).unwrap();
        let kinds: Vec<_> = checked.steps.iter().map(Step::kind).collect();
        assert_eq!(kinds, vec!["tool", "tool", "remote", "wait", "tool"]);
        match &checked.steps[4] {
            Step::Tool(t) => {
                assert_eq!(t.evaluated_permission.as_deref(), Some("ask"));
                assert_eq!(t.confirm.as_deref(), Some("allow"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(checked.scenario.memory_stores[1].access(), Access::ReadOnly);
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            (
                json!({"steps": [{"tool": "read", "input": {"file_path": "{mount:nope}/x"}}]}),
                "mount:nope",
            ),
            (
                json!({"steps": [{"remote": {"op": "update", "store": "x", "path": "/a", "content": "c"}}]}),
                "not a store",
            ),
            (json!({"steps": [{"teleport": true}]}), "steps[0]"),
            (
                json!({"steps": [{"tool": "bash", "evaluated_permission": "ask"}]}),
                "confirm",
            ),
            (
                json!({"steps": [{"tool": "bash", "confirm": "allow"}]}),
                "confirm only",
            ),
            (
                json!({"memory_stores": [{"key": "a", "name": "A"}, {"key": "a", "name": "B"}]}),
                "unique",
            ),
            (
                json!({"memory_stores": [{"key": "a", "name": "A", "memories": {"nope": "x"}}]}),
                "must start",
            ),
            (json!({"expect_final": {"ghost": {}}}), "ghost"),
            (json!({"surprise": 1}), "unknown field"),
        ];
        for (doc, needle) in cases {
            let err = parse(doc.clone()).unwrap_err();
            assert!(err.contains(needle), "{doc}: {err}");
        }
    }

    #[test]
    fn substitution_reaches_nested_strings() {
        let mounts = BTreeMap::from([("kb".to_string(), "/mnt/memory/team-kb".to_string())]);
        let input = json!({"a": "{mount:kb}/x", "b": ["cat {mount:kb}/y {mount:kb}/z"], "n": 3});
        assert_eq!(
            substitute(&input, &mounts),
            json!({"a": "/mnt/memory/team-kb/x", "b": ["cat /mnt/memory/team-kb/y /mnt/memory/team-kb/z"], "n": 3})
        );
    }
}
