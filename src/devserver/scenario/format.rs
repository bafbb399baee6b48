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
//! optional `agent` (tools, skills) for the session, a
//! `{"terminate": true}` step that ends the session, `{"faults": [rule…]}`
//! and `{"clear_faults": true}` steps that add and clear `/dev/faults` rules
//! at that point of the session, a store's `mount_path` (a string used
//! verbatim, or `null` for none: the worker then falls back to
//! `<workdir>/memory/<name>`), and `prepare`: what the worker's host holds
//! before the session (see [`Prepare`]).

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
    /// What the worker's host holds before the session starts. The
    /// devserver only checks it; whoever runs the worker prepares it.
    #[serde(default)]
    pub prepare: Option<Prepare>,
}

/// Files, directories and symlinks a scenario needs on the worker's host
/// before its session starts: a project in the agent's working directory, a
/// link for the agent to follow. Paths are absolute once `{root}` (a
/// directory the runner of the worker chooses for the scenario) and
/// `{workdir}` (the worker's working directory) are replaced
/// ([`substitute_host`]), and must lie under `{root}`; symlink targets are
/// written as given (after the same replacement), so a link may point
/// anywhere, dangling or outside.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prepare {
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Path → content (UTF-8); parents are created.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Link path → target.
    #[serde(default)]
    pub symlinks: BTreeMap<String, String>,
}

/// Entries of a [`Prepare`], all kinds together.
pub const MAX_PREPARED: usize = 1_000;

impl Prepare {
    fn check(&self) -> Result<(), FormatError> {
        let count = self.dirs.len() + self.files.len() + self.symlinks.len();
        if count > MAX_PREPARED {
            return Err(format!("prepare: {count} entries; at most {MAX_PREPARED}"));
        }
        let paths = self
            .dirs
            .iter()
            .chain(self.files.keys())
            .chain(self.symlinks.keys());
        for path in paths {
            if !(path.starts_with('/')
                || path.starts_with("{root}/")
                || path.starts_with("{workdir}"))
            {
                return Err(format!(
                    "prepare: {path:?} must be absolute, or start with {{root}}/ or {{workdir}}"
                ));
            }
            if path.split('/').any(|c| c == "..") || path.contains('\0') {
                return Err(format!("prepare: {path:?} has a .. component or a NUL"));
            }
        }
        for content in self.files.values() {
            validate::content(content).map_err(|e| format!("prepare.files: {e}"))?;
        }
        Ok(())
    }

    /// Create the entries on this host, `{root}` and `{workdir}` replaced:
    /// directories, then files (parents created), then symlinks. Refuses
    /// (before writing anything) a path that does not lie under `root`.
    pub fn apply(&self, root: &std::path::Path, workdir: &std::path::Path) -> std::io::Result<()> {
        let host = |p: &str| std::path::PathBuf::from(substitute_host_str(p, root, workdir));
        let outside = |p: &std::path::Path| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not under {}", p.display(), root.display()),
            )
        };
        let all: Vec<std::path::PathBuf> = self
            .dirs
            .iter()
            .chain(self.files.keys())
            .chain(self.symlinks.keys())
            .map(|p| host(p))
            .collect();
        if let Some(bad) = all.iter().find(|p| !p.starts_with(root)) {
            return Err(outside(bad));
        }
        for dir in &self.dirs {
            std::fs::create_dir_all(host(dir))?;
        }
        for (path, content) in &self.files {
            let path = host(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, content)?;
        }
        for (link, target) in &self.symlinks {
            let link = host(link);
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::os::unix::fs::symlink(substitute_host_str(target, root, workdir), link)?;
        }
        Ok(())
    }
}

/// `{root}` and `{workdir}` replaced in `s`.
pub fn substitute_host_str(s: &str, root: &std::path::Path, workdir: &std::path::Path) -> String {
    s.replace("{root}", &root.display().to_string())
        .replace("{workdir}", &workdir.display().to_string())
}

/// Replace `{root}` and `{workdir}` in every string of a scenario document:
/// what the runner of the worker does before posting it (the devserver does
/// not know the worker's host).
pub fn substitute_host(doc: &Value, root: &std::path::Path, workdir: &std::path::Path) -> Value {
    match doc {
        Value::String(s) => Value::String(substitute_host_str(s, root, workdir)),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| substitute_host(v, root, workdir))
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    (
                        substitute_host_str(k, root, workdir),
                        substitute_host(v, root, workdir),
                    )
                })
                .collect(),
        ),
        other => other.clone(),
    }
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
    /// The session resource's `mount_path`, replacing the derived one: a
    /// string used verbatim, or `null` for none. Absent: derived from the
    /// name under the devserver's mount root, as the API does.
    #[serde(default, deserialize_with = "present")]
    pub(crate) mount_path: Option<Option<String>>,
}

/// A field that is present, `null` included (absent stays `None` through
/// `#[serde(default)]`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
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
    /// Add these `/dev/faults` rules now (a lost or stuck request at a
    /// chosen point of the session).
    Faults(Vec<crate::devserver::faults::FaultRule>),
    /// Clear every `/dev/faults` rule.
    ClearFaults,
}

impl Step {
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Tool(t) if t.custom => "custom_tool",
            Step::Tool(_) => "tool",
            Step::Remote(_) => "remote",
            Step::Wait(_) => "wait",
            Step::Terminate => "terminate",
            Step::Faults(_) => "faults",
            Step::ClearFaults => "clear_faults",
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
    let step = if obj.contains_key("remote") {
        parse_remote(raw, stores)
    } else if obj.contains_key("faults") {
        parse_faults(obj)
    } else if obj.contains_key("clear_faults") {
        exactly_true(obj, "clear_faults").map(|()| Step::ClearFaults)
    } else if obj.contains_key("terminate") {
        exactly_true(obj, "terminate").map(|()| Step::Terminate)
    } else if obj.contains_key("wait_ms") {
        parse_wait(raw)
    } else if obj.contains_key("tool") || obj.contains_key("custom_tool") {
        parse_tool_step(raw, stores)
    } else {
        Err(
            "a step is a tool, custom_tool, remote, wait_ms, terminate, faults or clear_faults step"
                .to_string(),
        )
    };
    step.map_err(|e| step_error(index, e))
}

/// A step of its own kind only: exactly `{"<key>": true}`.
fn exactly_true(obj: &serde_json::Map<String, Value>, key: &str) -> Result<(), String> {
    if obj.len() != 1 || obj[key] != Value::Bool(true) {
        return Err(format!("a {key} step is exactly {{\"{key}\": true}}"));
    }
    Ok(())
}

fn parse_remote(raw: &Value, stores: &BTreeSet<&str>) -> Result<Step, String> {
    let r: RawRemote = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
    let op = r.remote;
    if !stores.contains(op.store.as_str()) {
        return Err(format!(
            "remote.store {:?} is not a store of this scenario",
            op.store
        ));
    }
    validate::memory_path("remote.path", &op.path)?;
    match op.op.as_str() {
        "create" | "update" => {
            let content = op
                .content
                .as_deref()
                .ok_or_else(|| format!("remote.{} needs content", op.op))?;
            validate::content(content)?;
        }
        "delete" => {}
        "rename" => {
            let to = op
                .new_path
                .as_deref()
                .ok_or("remote.rename needs new_path")?;
            validate::memory_path("remote.new_path", to)?;
        }
        other => {
            return Err(format!(
                "remote.op {other:?} is not create, update, delete or rename"
            ));
        }
    }
    Ok(Step::Remote(op))
}

fn parse_faults(obj: &serde_json::Map<String, Value>) -> Result<Step, String> {
    if obj.len() != 1 {
        return Err("a faults step is exactly {\"faults\": [rule…]}".to_string());
    }
    let rules: Vec<crate::devserver::faults::FaultRule> =
        serde_json::from_value(obj["faults"].clone()).map_err(|e| e.to_string())?;
    for rule in &rules {
        rule.check()?;
    }
    if rules.len() > crate::devserver::faults::MAX_RULES {
        return Err(crate::devserver::faults::too_many_rules(rules.len()));
    }
    Ok(Step::Faults(rules))
}

fn parse_wait(raw: &Value) -> Result<Step, String> {
    let w: RawWait = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
    if w.wait_ms > MAX_WAIT_MS {
        return Err(format!(
            "wait_ms is {}; the most a step waits is {MAX_WAIT_MS} (10 minutes)",
            w.wait_ms
        ));
    }
    Ok(Step::Wait(w.wait_ms))
}

fn parse_tool_step(raw: &Value, stores: &BTreeSet<&str>) -> Result<Step, String> {
    let t: RawToolStep = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
    let (name, custom) = match (t.tool, t.custom_tool) {
        (Some(n), None) => (n, false),
        (None, Some(n)) => (n, true),
        _ => return Err("give either tool or custom_tool, not both".to_string()),
    };
    if name.is_empty() {
        return Err("the tool name is empty".to_string());
    }
    let input = t.input.unwrap_or_else(|| Value::Object(Default::default()));
    if !input.is_object() {
        return Err("input must be an object".to_string());
    }
    check_gate(
        t.evaluated_permission.as_deref(),
        t.confirm.as_deref(),
        custom,
    )?;
    if let Some(ms) = t.timeout_ms
        && !(1..=MAX_TIMEOUT_MS).contains(&ms)
    {
        return Err(format!(
            "timeout_ms is {ms}; it must be between 1 and {MAX_TIMEOUT_MS} (an hour)"
        ));
    }
    let expect = t.expect.unwrap_or_default();
    check_mounts_named(&input, &expect, stores)?;
    Ok(Step::Tool(ToolStep {
        name,
        custom,
        input,
        expect,
        evaluated_permission: t.evaluated_permission,
        confirm: t.confirm,
        timeout_ms: t.timeout_ms,
    }))
}

/// The permission a call is gated by, and the answer to an `ask`.
fn check_gate(permission: Option<&str>, confirm: Option<&str>, custom: bool) -> Result<(), String> {
    if let Some(p) = permission
        && !matches!(p, "allow" | "ask" | "deny")
    {
        return Err("evaluated_permission must be allow, ask or deny".to_string());
    }
    if permission.is_some_and(|p| p != "allow") && custom {
        return Err("a custom tool call cannot be gated".to_string());
    }
    match (permission, confirm) {
        (Some("ask"), Some("allow" | "deny")) => Ok(()),
        (Some("ask"), _) => Err("an ask-gated call needs confirm: allow or deny".to_string()),
        (_, Some(_)) => Err("confirm only goes with evaluated_permission: ask".to_string()),
        _ => Ok(()),
    }
}

/// Every `{mount:KEY}` in the input and the expectations names a store of
/// the scenario.
fn check_mounts_named(
    input: &Value,
    expect: &Expect,
    stores: &BTreeSet<&str>,
) -> Result<(), String> {
    let expect_strings: Vec<Value> = [&expect.contains, &expect.not_contains]
        .into_iter()
        .flatten()
        .flat_map(|m| m.items().into_iter().map(|s| Value::String(s.to_string())))
        .collect();
    for key in mount_refs(input)
        .into_iter()
        .chain(expect_strings.iter().flat_map(mount_refs))
    {
        if !stores.contains(key.as_str()) {
            return Err(format!("{{mount:{key}}} names no store of this scenario"));
        }
    }
    Ok(())
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
    if let Some(prepare) = &scenario.prepare {
        prepare.check()?;
    }
    for (i, store) in scenario.memory_stores.iter().enumerate() {
        if let Some(Some(path)) = &store.mount_path
            && (path.len() > 1024 || path.contains('\0'))
        {
            return Err(format!(
                "memory_stores[{i}].mount_path: at most 1024 bytes, no NUL"
            ));
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
    use std::path::Path;

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
            (
                json!({"steps": [{"faults": [{"path": "/x", "rate": 3}]}]}),
                "rate must be between",
            ),
            (
                json!({"steps": [{"faults": [], "wait_ms": 1}]}),
                "a faults step is exactly",
            ),
            (json!({"steps": [{"clear_faults": false}]}), "clear_faults"),
            (
                json!({"prepare": {"files": {"relative/x": "y"}}}),
                "must be absolute",
            ),
            (
                json!({"prepare": {"dirs": ["{root}/../escape"]}}),
                ".. component",
            ),
            (
                json!({"memory_stores": [{"key": "a", "name": "A", "mount_path": "x\u{0}"}]}),
                "mount_path",
            ),
        ];
        for (doc, needle) in cases {
            let err = parse(doc.clone()).unwrap_err();
            assert!(err.contains(needle), "{doc}: {err}");
        }
    }

    #[test]
    fn extensions_parse_faults_steps_mount_paths_and_prepare() {
        let checked = parse(json!({
            "memory_stores": [
                {"key": "a", "name": "A", "mount_path": null},
                {"key": "b", "name": "B", "mount_path": "/srv/b"},
                {"key": "c", "name": "C"}
            ],
            "prepare": {"dirs": ["{root}/d"], "files": {"{workdir}/f": "x"}, "symlinks": {"{root}/l": "/etc"}},
            "steps": [
                {"faults": [{"method": "POST", "path": "/v1/memory_stores/*", "status": 503, "times": 1}]},
                {"clear_faults": true}
            ]
        }))
        .unwrap();
        let kinds: Vec<_> = checked.steps.iter().map(Step::kind).collect();
        assert_eq!(kinds, ["faults", "clear_faults"]);
        let paths: Vec<_> = checked
            .scenario
            .memory_stores
            .iter()
            .map(|s| s.mount_path.clone())
            .collect();
        assert_eq!(paths, [Some(None), Some(Some("/srv/b".into())), None]);
    }

    #[test]
    fn prepare_builds_the_host_under_its_root_and_refuses_to_leave_it() {
        let t = tempfile::tempdir().unwrap();
        let (root, work) = (t.path(), t.path().join("work"));
        let doc = substitute_host(
            &json!({"prepare": {
                "dirs": ["{root}/real"],
                "files": {"{workdir}/src/a.rs": "fn a() {}\n"},
                "symlinks": {"{root}/via": "{root}/real", "{workdir}/rel": "src"}
            }, "steps": [{"tool": "read", "input": {"file_path": "{workdir}/src/a.rs"}}]}),
            root,
            &work,
        );
        assert_eq!(
            doc["steps"][0]["input"]["file_path"],
            format!("{}/src/a.rs", work.display())
        );
        let prepare: Prepare = serde_json::from_value(doc["prepare"].clone()).unwrap();
        prepare.apply(root, &work).unwrap();
        assert_eq!(
            std::fs::read_to_string(work.join("src/a.rs")).unwrap(),
            "fn a() {}\n"
        );
        assert_eq!(
            std::fs::read_link(root.join("via")).unwrap(),
            root.join("real")
        );
        assert_eq!(
            std::fs::read_link(work.join("rel")).unwrap(),
            Path::new("src")
        );
        let outside = Prepare {
            files: BTreeMap::from([("/etc/evil".to_string(), "x".to_string())]),
            ..Default::default()
        };
        assert!(outside.apply(root, &work).is_err());
        assert!(!Path::new("/etc/evil").exists());
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
