//! Symbolic links in the file tools, as the official SDK treats them (issue
//! 24 item 6): a path is accepted when, `..` collapsed by text first and
//! then every link followed (the leaf and a dangling one included, at most
//! 40 hops), it lies inside the workdir or an allowed root; the tool then
//! works on that canonical path. A link that leaves every root is refused
//! with the reference's words, a loop answers "too many levels of symbolic
//! links" without the workdir, a read-only root refuses writes whichever
//! alias reached it, and `glob` follows a symlinked directory as Python's
//! `Path.glob` does (through a plain or wildcard segment, never through `**`,
//! keeping only matches whose canonical path stays in the search root).
//! Item 8: `glob` with an empty pattern is refused as the reference refuses it.
//!
//! Each case is listed once with envworker's answer and, where it differs on
//! purpose, the reference's; [`the_reference_gives_the_listed_answers`] runs
//! the same calls through the SDK's own tools (`tests/conformance/agent_tools.py`)
//! on an identical tree, so the listed answers are the reference's, not a guess.

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::toolbox::write;
use envworker::tools::{ToolContext, ToolError, Toolset};
use serde_json::{Value, json};
use tokio::time::Instant;

/// A host: `work` (the workdir), `mem` (a store), `kb` (a read-only store),
/// `real/store` (a store whose mount path, `link/store`, has a symlinked
/// ancestor) and `outside`, with the links each case needs.
struct Host {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let host = Host { _dir: dir, base };
        host.build();
        host
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    fn file(&self, rel: &str, content: &str) {
        write(&self.p(rel), content);
    }

    /// `rel` -> `target`; `{root}` in `target` is the host's root.
    fn link(&self, rel: &str, target: &str) {
        let at = self.p(rel);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        symlink(self.sub(target), at).unwrap();
    }

    fn sub(&self, text: &str) -> String {
        text.replace("{root}", &self.base.display().to_string())
    }

    fn build(&self) {
        for d in ["work", "mem", "kb", "outside", "real/store"] {
            std::fs::create_dir_all(self.p(d)).unwrap();
        }
        self.file("work/real.txt", "real\n");
        self.link("work/alias.txt", "real.txt");
        self.link("work/c1", "c2");
        self.link("work/c2", "c3");
        self.link("work/c3", "real.txt");
        self.link("work/abs-in", "{root}/work/real.txt");
        self.link("work/climb", "../work/real.txt");
        self.link("work/new.txt", "sub/created.txt");
        self.link("work/dangling-out", "{root}/outside/not-yet");
        self.file("mem/a.md", "memory a\n");
        self.link("work/memlink", "{root}/mem");
        self.link("work/tomem-rel", "../mem/a.md");
        self.link("mem/up", "../work/real.txt");
        self.file("work/releases/42/app.txt", "v42\n");
        self.link("work/current", "releases/42");
        self.file("work/node_modules/pkg/bin/tool.js", "tool\n");
        self.link("work/node_modules/.bin/tool", "../pkg/bin/tool.js");
        self.file("outside/secret", "secret\n");
        self.file("outside/o.txt", "o needle\n");
        self.link("work/link-out", "{root}/outside/secret");
        self.link("work/rel-out", "../outside/secret");
        self.link("work/dir-out", "../outside");
        self.file("kb/faq.md", "Q\n");
        self.link("work/kb-alias", "{root}/kb");
        self.link("mem/to-kb", "../kb/faq.md");
        self.link("work/loop-a", "loop-b");
        self.link("work/loop-b", "loop-a");
        self.link("work/self", "self");
        self.file("work/real-edit.txt", "one two\n");
        self.link("work/edit-alias.txt", "real-edit.txt");
        self.file("real/store/n.md", "stored\n");
        self.link("link", "real");
        // 40 hops to a missing file, 41 hops, and 41 links to one that exists.
        for (dir, links, exists) in [("d40", 40, false), ("d41", 41, false), ("e41", 41, true)] {
            for i in 0..links {
                let next = if i + 1 < links {
                    format!("l{}", i + 1)
                } else {
                    "target".to_string()
                };
                self.link(&format!("work/hops/{dir}/l{i}"), &next);
            }
            if exists {
                self.file(&format!("work/hops/{dir}/target"), "far\n");
            }
        }
        // What glob and grep walk.
        self.file("work/g/real.txt", "real needle\n");
        self.link("work/g/alias.txt", "real.txt");
        self.link("work/g/dangling.txt", "nowhere.txt");
        self.file("work/g/realdir/d.txt", "d needle\n");
        self.link("work/g/linkdir", "realdir");
        self.link("work/g/dirloop", ".");
        self.link("work/g/out", "{root}/outside");
        self.link("work/g/tomem", "{root}/mem");
    }

    /// The toolset a session gets: the stores as the memory engine gives
    /// them (canonical folders).
    fn context(&self) -> ToolContext {
        let mut ctx = ToolContext::new(self.p("work"));
        ctx.allowed_roots = vec![self.p("mem"), self.p("kb"), self.p("real/store")];
        ctx.read_only_roots = vec![self.p("kb")];
        ctx.bash_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        ctx
    }
}

/// An answer: the exact text, or (glob and grep) the lines in any order.
#[derive(Debug, Clone)]
enum Want {
    Ok(&'static str),
    Err(&'static str),
    Lines(&'static [&'static str]),
}

/// What the reference answers, when it differs from envworker on purpose.
#[derive(Debug, Clone)]
enum Reference {
    Same,
    Differs(Want, &'static str),
}

struct Case {
    what: &'static str,
    tool: &'static str,
    input: Value,
    want: Want,
    reference: Reference,
}

fn case(what: &'static str, tool: &'static str, input: Value, want: Want) -> Case {
    Case {
        what,
        tool,
        input,
        want,
        reference: Reference::Same,
    }
}

impl Case {
    fn but_the_reference(mut self, answers: Want, why: &'static str) -> Case {
        self.reference = Reference::Differs(answers, why);
        self
    }
}

/// Every case, in the order they run (later ones see earlier writes).
fn cases() -> Vec<Case> {
    use Want::*;
    vec![
        // ---- glob and grep (before any write changes the tree) ----
        case(
            "glob lists a link to a file inside the search root under the link's name",
            "glob",
            json!({"pattern": "*.txt", "path": "g"}),
            Lines(&["{root}/work/g/real.txt", "{root}/work/g/alias.txt"]),
        )
        .but_the_reference(
            Lines(&[
                "{root}/work/g/real.txt",
                "{root}/work/g/alias.txt",
                "{root}/work/g/dangling.txt",
            ]),
            "Python's Path.glob lists a dangling link too; envworker's glob lists regular files only",
        ),
        case(
            "glob follows a symlinked directory through a wildcard segment, loops included, and drops a link leaving the search root",
            "glob",
            json!({"pattern": "*/*.txt", "path": "g"}),
            Lines(&[
                "{root}/work/g/realdir/d.txt",
                "{root}/work/g/linkdir/d.txt",
                "{root}/work/g/dirloop/real.txt",
                "{root}/work/g/dirloop/alias.txt",
            ]),
        )
        .but_the_reference(
            Lines(&[
                "{root}/work/g/realdir/d.txt",
                "{root}/work/g/linkdir/d.txt",
                "{root}/work/g/dirloop/real.txt",
                "{root}/work/g/dirloop/alias.txt",
                "{root}/work/g/dirloop/dangling.txt",
            ]),
            "a dangling link (regular files only)",
        ),
        case(
            "glob's ** never descends a symlinked directory",
            "glob",
            json!({"pattern": "**/*.txt", "path": "g"}),
            Lines(&[
                "{root}/work/g/real.txt",
                "{root}/work/g/alias.txt",
                "{root}/work/g/realdir/d.txt",
            ]),
        )
        .but_the_reference(
            Lines(&[
                "{root}/work/g/real.txt",
                "{root}/work/g/alias.txt",
                "{root}/work/g/dangling.txt",
                "{root}/work/g/realdir/d.txt",
            ]),
            "a dangling link (regular files only)",
        ),
        case(
            "glob through a named symlinked directory",
            "glob",
            json!({"pattern": "linkdir/*.txt", "path": "g"}),
            Lines(&["{root}/work/g/linkdir/d.txt"]),
        ),
        case(
            "glob through a directory link loop stays bounded by the pattern",
            "glob",
            json!({"pattern": "dirloop/dirloop/realdir/*", "path": "g"}),
            Lines(&["{root}/work/g/dirloop/dirloop/realdir/d.txt"]),
        ),
        case(
            "glob drops what a link leads to outside the search root",
            "glob",
            json!({"pattern": "out/*", "path": "g"}),
            Ok("no matches"),
        ),
        case(
            "glob drops a link into a store when the search root is the workdir",
            "glob",
            json!({"pattern": "tomem/*.md", "path": "g"}),
            Ok("no matches"),
        ),
        case(
            "glob in a symlinked directory answers its canonical paths",
            "glob",
            json!({"pattern": "*", "path": "g/linkdir"}),
            Lines(&["{root}/work/g/realdir/d.txt"]),
        ),
        case(
            "glob in a workdir link into a store answers the store's paths",
            "glob",
            json!({"pattern": "*.md", "path": "memlink"}),
            Lines(&["{root}/mem/a.md"]),
        ),
        case(
            "glob under a release link",
            "glob",
            json!({"pattern": "*.txt", "path": "current"}),
            Lines(&["{root}/work/releases/42/app.txt"]),
        ),
        case(
            "glob with an empty pattern is refused (item 8)",
            "glob",
            json!({"pattern": ""}),
            Err("glob: Unacceptable pattern: ''"),
        ),
        case(
            "glob with an empty pattern under a path is refused too",
            "glob",
            json!({"pattern": "", "path": "g/linkdir"}),
            Err("glob: Unacceptable pattern: ''"),
        ),
        case(
            "glob with ** inside a segment is refused in Path.glob's words",
            "glob",
            json!({"pattern": "a**/*.txt", "path": "g"}),
            Err("glob: Invalid pattern: '**' can only be an entire path component"),
        ),
        case(
            "glob under a link leaving the roots",
            "glob",
            json!({"pattern": "*", "path": "dir-out"}),
            Err("glob: path \"dir-out\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "glob under a link loop",
            "glob",
            json!({"pattern": "*", "path": "loop-a"}),
            Err("glob: path \"loop-a\": too many levels of symbolic links"),
        ),
        case(
            "grep's walk never follows a link (neither file nor directory)",
            "grep",
            json!({"pattern": "needle", "path": "g"}),
            Lines(&[
                "{root}/work/g/real.txt:1:real needle",
                "{root}/work/g/realdir/d.txt:1:d needle",
            ]),
        ),
        case(
            "grep in a symlinked directory answers its canonical paths",
            "grep",
            json!({"pattern": "needle", "path": "g/linkdir"}),
            Lines(&["{root}/work/g/realdir/d.txt:1:d needle"]),
        ),
        case(
            "grep of a link to a file searches the file, by its canonical path",
            "grep",
            json!({"pattern": "needle", "path": "g/alias.txt"}),
            Lines(&["{root}/work/g/real.txt:1:real needle"]),
        ),
        case(
            "grep under a link leaving the roots",
            "grep",
            json!({"pattern": "x", "path": "dir-out"}),
            Err("grep: path \"dir-out\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "grep under a link loop",
            "grep",
            json!({"pattern": "x", "path": "loop-a"}),
            Err("grep: path \"loop-a\": too many levels of symbolic links"),
        ),
        // ---- read ----
        case("a relative link to a file", "read", json!({"file_path": "alias.txt"}), Ok("real\n")),
        case("a chain of links", "read", json!({"file_path": "c1"}), Ok("real\n")),
        case("an absolute link inside the workdir", "read", json!({"file_path": "abs-in"}), Ok("real\n")),
        case(
            "a relative link that climbs above the workdir and comes back",
            "read",
            json!({"file_path": "climb"}),
            Ok("real\n"),
        ),
        case(
            "a relative link from the workdir into a store",
            "read",
            json!({"file_path": "tomem-rel"}),
            Ok("memory a\n"),
        ),
        case(
            "a link from a store into the workdir",
            "read",
            json!({"file_path": "{root}/mem/up"}),
            Ok("real\n"),
        ),
        case(
            "a workdir link into a store (another allowed root)",
            "read",
            json!({"file_path": "memlink/a.md"}),
            Ok("memory a\n"),
        ),
        case("current -> releases/42", "read", json!({"file_path": "current/app.txt"}), Ok("v42\n")),
        case(
            "a node_modules/.bin style link",
            "read",
            json!({"file_path": "node_modules/.bin/tool"}),
            Ok("tool\n"),
        ),
        case(
            "an absolute link to a file outside",
            "read",
            json!({"file_path": "link-out"}),
            Err("read: path \"link-out\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "a relative link to a file outside",
            "read",
            json!({"file_path": "rel-out"}),
            Err("read: path \"rel-out\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "a file under a directory link leading outside",
            "read",
            json!({"file_path": "dir-out/secret"}),
            Err("read: path \"dir-out/secret\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "`..` is collapsed by text before any link is followed",
            "read",
            json!({"file_path": "dir-out/../real.txt"}),
            Ok("real\n"),
        ),
        case(
            "a read through a link into a read-only store",
            "read",
            json!({"file_path": "kb-alias/faq.md"}),
            Ok("Q\n"),
        ),
        case(
            "a link to a directory is not a regular file",
            "read",
            json!({"file_path": "g/linkdir"}),
            Err("read: g/linkdir: not a regular file"),
        ),
        case(
            "a two-link loop",
            "read",
            json!({"file_path": "loop-a"}),
            Err("read: path \"loop-a\": too many levels of symbolic links"),
        ),
        case(
            "a link to itself",
            "read",
            json!({"file_path": "self"}),
            Err("read: path \"self\": too many levels of symbolic links"),
        ),
        case(
            "a chain of 41 links to a file that exists",
            "read",
            json!({"file_path": "hops/e41/l0"}),
            Err("read: path \"hops/e41/l0\": too many levels of symbolic links"),
        )
        .but_the_reference(
            Ok("far\n"),
            "Python's realpath follows any number of links to a file that exists; envworker stops at 40 hops, as the kernel does",
        ),
        case(
            "a store at a mount path with a symlinked ancestor, at the path the agent is told",
            "read",
            json!({"file_path": "{root}/link/store/n.md"}),
            Ok("stored\n"),
        ),
        // ---- write and edit ----
        case(
            "write through a dangling link creates its target (and its directory)",
            "write",
            json!({"file_path": "new.txt", "content": "made"}),
            Ok("wrote 4 bytes to new.txt"),
        ),
        case("the dangling link's target", "read", json!({"file_path": "sub/created.txt"}), Ok("made")),
        case("the link, no longer dangling", "read", json!({"file_path": "new.txt"}), Ok("made")),
        case(
            "write through a dangling link leading outside",
            "write",
            json!({"file_path": "dangling-out", "content": "x"}),
            Err("write: path \"dangling-out\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "write under a directory link leading outside",
            "write",
            json!({"file_path": "dir-out/new", "content": "x"}),
            Err("write: path \"dir-out/new\" is outside the session's working directory and its other permitted directories"),
        ),
        case(
            "write 40 hops away",
            "write",
            json!({"file_path": "hops/d40/l0", "content": "y"}),
            Ok("wrote 1 bytes to hops/d40/l0"),
        ),
        case(
            "write 41 hops away",
            "write",
            json!({"file_path": "hops/d41/l0", "content": "y"}),
            Err("write: path \"hops/d41/l0\": too many levels of symbolic links"),
        ),
        case(
            "write under a link loop",
            "write",
            json!({"file_path": "loop-a/x", "content": "x"}),
            Err("write: path \"loop-a/x\": too many levels of symbolic links"),
        ),
        case(
            "write through a workdir link into a store",
            "write",
            json!({"file_path": "memlink/b.md", "content": "b"}),
            Ok("wrote 1 bytes to memlink/b.md"),
        ),
        case("what it wrote, in the store", "read", json!({"file_path": "{root}/mem/b.md"}), Ok("b")),
        case(
            "write through an alias of a read-only store",
            "write",
            json!({"file_path": "kb-alias/faq.md", "content": "x"}),
            Err("write: kb-alias/faq.md is inside read-only directory {root}/kb"),
        ),
        case(
            "edit through an alias of a read-only store",
            "edit",
            json!({"file_path": "kb-alias/faq.md", "old_string": "Q", "new_string": "A"}),
            Err("edit: kb-alias/faq.md is inside read-only directory {root}/kb"),
        ),
        case(
            "write through a writable store's link into a read-only store",
            "write",
            json!({"file_path": "{root}/mem/to-kb", "content": "x"}),
            Err("write: {root}/mem/to-kb is inside read-only directory {root}/kb"),
        ),
        case(
            "edit through a link edits its target",
            "edit",
            json!({"file_path": "edit-alias.txt", "old_string": "one", "new_string": "1"}),
            Ok("edited edit-alias.txt (1 replacement(s))"),
        ),
        case("the edited target", "read", json!({"file_path": "real-edit.txt"}), Ok("1 two\n")),
        case(
            "write through a link replaces its target's content",
            "write",
            json!({"file_path": "alias.txt", "content": "replaced\n"}),
            Ok("wrote 9 bytes to alias.txt"),
        ),
        case("the written target", "read", json!({"file_path": "real.txt"}), Ok("replaced\n")),
        case(
            "write to a store at a mount path with a symlinked ancestor",
            "write",
            json!({"file_path": "{root}/link/store/m.md", "content": "m"}),
            Ok("wrote 1 bytes to {root}/link/store/m.md"),
        ),
        case(
            "glob in that store answers its canonical paths",
            "glob",
            json!({"pattern": "*.md", "path": "{root}/link/store"}),
            Lines(&["{root}/real/store/n.md", "{root}/real/store/m.md"]),
        ),
    ]
}

/// `{root}` replaced by the host's root, in every string of `value`.
fn substitute(host: &Host, value: &Value) -> Value {
    serde_json::from_str(&host.sub(&value.to_string())).unwrap()
}

/// Does `answer` (`Ok`/`Err` text) match `want` on `host`?
fn matches(host: &Host, want: &Want, answer: &Result<String, String>) -> bool {
    let lines = |text: &str| {
        let mut v: Vec<String> = text.lines().map(str::to_string).collect();
        v.sort();
        v
    };
    match (want, answer) {
        (Want::Ok(w), Ok(got)) => host.sub(w) == *got,
        (Want::Err(w), Err(got)) => host.sub(w) == *got,
        (Want::Lines(w), Ok(got)) => {
            let mut want: Vec<String> = w.iter().map(|l| host.sub(l)).collect();
            want.sort();
            want == lines(got)
        }
        _ => false,
    }
}

async fn run_ours(host: &Host, calls: &[(&str, Value)]) -> Vec<Result<String, String>> {
    let tools = Toolset::new(host.context());
    let mut answers = Vec::new();
    for (tool, input) in calls {
        answers.push(
            tools
                .run(
                    tool,
                    input.clone(),
                    Instant::now() + Duration::from_secs(30),
                )
                .await
                .map(|o| o.text())
                .map_err(|ToolError { message }| message),
        );
    }
    answers
}

fn calls(host: &Host, cases: &[Case]) -> Vec<(&'static str, Value)> {
    cases
        .iter()
        .map(|c| (c.tool, substitute(host, &c.input)))
        .collect()
}

/// Every case answers as listed, with `openat2` and with the walk the tools
/// fall back to without it; nothing lands outside and no link is replaced.
#[tokio::test]
async fn every_case_answers_as_listed() {
    for openat2 in [true, false] {
        envworker::fsx::use_openat2(openat2);
        let host = Host::new();
        let cases = cases();
        let answers = run_ours(&host, &calls(&host, &cases)).await;
        let wrong: Vec<String> = cases
            .iter()
            .zip(&answers)
            .filter(|(c, a)| !matches(&host, &c.want, a))
            .map(|(c, a)| {
                format!(
                    "{} ({} {}): got {a:?}, want {:?}",
                    c.what, c.tool, c.input, c.want
                )
            })
            .collect();
        assert!(wrong.is_empty(), "openat2={openat2}:\n{}", wrong.join("\n"));
        // Nothing was created outside; the links written through are links still.
        assert!(!host.p("outside/not-yet").exists());
        assert!(!host.p("outside/new").exists());
        for link in [
            "work/alias.txt",
            "work/edit-alias.txt",
            "work/new.txt",
            "work/hops/d40/l0",
        ] {
            assert!(
                host.p(link)
                    .symlink_metadata()
                    .unwrap()
                    .file_type()
                    .is_symlink(),
                "{link}"
            );
        }
        assert_eq!(std::fs::read_to_string(host.p("kb/faq.md")).unwrap(), "Q\n");
        assert_eq!(
            std::fs::read_to_string(host.p("real/store/m.md")).unwrap(),
            "m"
        );
        assert_eq!(
            std::fs::read_to_string(host.p("work/hops/d40/target")).unwrap(),
            "y"
        );
    }
    envworker::fsx::use_openat2(true);
}

/// Python's `path 'x'` (its `repr`) as envworker writes it, `path "x"`.
fn double_quoted(text: &str) -> String {
    let Some(at) = text.find("path '") else {
        return text.to_string();
    };
    let start = at + "path '".len();
    let Some(len) = text[start..].find(['\'']) else {
        return text.to_string();
    };
    format!(
        "{}path \"{}\"{}",
        &text[..at],
        &text[start..start + len],
        &text[start + len + 1..]
    )
}

/// The SDK's answers, one per case, on `host`'s tree (its own copy).
async fn run_reference(host: &Host, cases: &[Case]) -> Vec<Result<String, String>> {
    let ctx = host.context();
    let request = json!({
        "workdir": ctx.workdir,
        "allowed_roots": ctx.allowed_roots,
        "read_only_roots": ctx.read_only_roots,
        "calls": calls(host, cases),
    });
    let file = host.p("request.json");
    std::fs::write(&file, request.to_string()).unwrap();
    let empty_path = host.p("no-rg");
    std::fs::create_dir(&empty_path).unwrap();
    let (file, empty_path) = (file.display().to_string(), empty_path.display().to_string());
    let out = tokio::task::spawn_blocking(move || {
        crate::common::sdk::run_script(
            "agent_tools.py",
            &[("AGENT_TOOLS_REQUEST", &file), ("PATH", &empty_path)],
        )
    })
    .await
    .unwrap();
    let answers: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(answers.len(), cases.len());
    answers
        .iter()
        .map(|a| {
            let text = double_quoted(a["text"].as_str().unwrap());
            if a["ok"] == true { Ok(text) } else { Err(text) }
        })
        .collect()
}

/// An answer with the host's root spelled `{root}` and glob's lines sorted
/// (their order is by mtime, which two trees need not share).
fn comparable(host: &Host, tool: &str, answer: &Result<String, String>) -> Result<String, String> {
    let root = host.base.display().to_string();
    let plain = |text: &String| {
        let text = text.replace(&root, "{root}");
        if tool != "glob" {
            return text;
        }
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    };
    answer.as_ref().map(plain).map_err(plain)
}

/// The SDK's own tools give the answers listed as the reference's, on an
/// identical tree: the listed answers are the reference's, not a guess; and
/// where a case lists no difference, envworker's answer (on a third tree)
/// is the SDK's, text for text. With `--nocapture` it prints the table of
/// both answers, case by case.
#[tokio::test]
async fn the_reference_gives_the_listed_answers() {
    let (host, ours_host) = (Host::new(), Host::new());
    let cases = cases();
    let answers = run_reference(&host, &cases).await;
    let ours = run_ours(&ours_host, &calls(&ours_host, &cases)).await;
    let mut wrong = Vec::new();
    eprintln!("| case | call | the SDK (Python 2.10.0) | envworker |\n|---|---|---|---|");
    for ((c, theirs), mine) in cases.iter().zip(&answers).zip(&ours) {
        let (want, why) = match &c.reference {
            Reference::Same => (&c.want, "the same as envworker"),
            Reference::Differs(want, why) => (want, *why),
        };
        if !matches(&host, want, theirs) {
            wrong.push(format!(
                "{} ({} {}): the SDK answered {theirs:?}, listed {want:?} ({why})",
                c.what, c.tool, c.input
            ));
        }
        let (theirs, mine) = (
            comparable(&host, c.tool, theirs),
            comparable(&ours_host, c.tool, mine),
        );
        if matches!(c.reference, Reference::Same) && theirs != mine {
            wrong.push(format!(
                "{} ({} {}): the SDK answered {theirs:?}, envworker {mine:?}",
                c.what, c.tool, c.input
            ));
        }
        let cell = |a: &Result<String, String>| match a {
            Ok(t) => format!("ok: `{}`", t.replace('\n', "` `")),
            Err(t) => format!("error: `{}`", t.replace('\n', "` `")),
        };
        eprintln!(
            "| {} | {} `{}` | {} | {} |",
            c.what,
            c.tool,
            c.input,
            cell(&theirs),
            cell(&mine)
        );
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

/// A refusal naming the agent's own spelling never carries the workdir,
/// whichever tool meets the loop.
#[tokio::test]
async fn a_loop_error_never_reveals_the_workdir() {
    let host = Host::new();
    let work = host.p("work").display().to_string();
    let answers = run_ours(
        &host,
        &[
            ("read", json!({"file_path": "loop-a"})),
            ("write", json!({"file_path": "self", "content": "x"})),
            (
                "edit",
                json!({"file_path": "loop-b", "old_string": "a", "new_string": "b"}),
            ),
            ("glob", json!({"pattern": "*", "path": "self"})),
            ("grep", json!({"pattern": "x", "path": "loop-a/deeper"})),
        ],
    )
    .await;
    for answer in answers {
        let err = answer.unwrap_err();
        assert!(err.ends_with("too many levels of symbolic links"), "{err}");
        assert!(!err.contains(&work), "leaks the workdir: {err}");
    }
}

/// A tree of directory links that loop back (`a -> .`, `b -> ..`, and
/// links to each other) costs glob and grep bounded time, whatever the
/// pattern.
#[tokio::test]
async fn glob_and_grep_over_link_loops_end_in_bounded_time() {
    let host = Host::new();
    for (link, target) in [
        ("work/l/a", "."),
        ("work/l/b", ".."),
        ("work/l/c", "a"),
        ("work/l/d", "../l"),
    ] {
        host.link(link, target);
    }
    host.file("work/l/f.txt", "needle\n");
    let tools = Toolset::new(host.context());
    let started = std::time::Instant::now();
    for (tool, input) in [
        ("glob", json!({"pattern": "**/*.txt", "path": "l"})),
        (
            "glob",
            json!({"pattern": "*/*/*/*/*/*/*/*/f.txt", "path": "l"}),
        ),
        (
            "glob",
            json!({"pattern": "**/*/**/*/**/*.txt", "path": "l"}),
        ),
        ("grep", json!({"pattern": "needle", "path": "l"})),
    ] {
        let out = tools
            .run(
                tool,
                input.clone(),
                Instant::now() + Duration::from_secs(20),
            )
            .await
            .map(|o| o.text())
            .unwrap_or_else(|e| panic!("{tool} {input}: {}", e.message));
        assert!(out.contains("f.txt"), "{tool} {input}: {out}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
