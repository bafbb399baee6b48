//! The agent toolset, called directly: inputs, outputs and error texts as
//! the official SDKs have them, the path policy (the Go SDK's tests by
//! name), and the shell's lifecycle.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::toolbox::{T, write};
use envworker::tools::{ToolError, ToolOutput, scrub};
use serde_json::json;
use tokio::time::Instant;

// ---- path policy (Go SDK: tools/agenttoolset tests) ----

#[tokio::test]
async fn relative_paths_resolve_against_the_workdir() {
    let t = T::new();
    write(&t.p("work/a/b.txt"), "hello");
    assert_eq!(
        t.call("read", json!({"file_path": "a/b.txt"}))
            .await
            .unwrap(),
        "hello"
    );
    assert_eq!(
        t.call("read", json!({"file_path": t.s("work/a/b.txt")}))
            .await
            .unwrap(),
        "hello"
    );
}

#[tokio::test]
async fn allowed_roots_are_reachable_and_everything_else_is_refused() {
    let t = T::new();
    write(&t.p("mem/n.md"), "note");
    write(&t.p("outside/secret"), "no");
    assert_eq!(
        t.call("read", json!({"file_path": t.s("mem/n.md")}))
            .await
            .unwrap(),
        "note"
    );
    let err = t
        .call("read", json!({"file_path": t.s("outside/secret")}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "read: path {:?} is outside the session's working directory and its other permitted directories",
            t.s("outside/secret")
        )
    );
    let err = t
        .call("read", json!({"file_path": "../outside/secret"}))
        .await
        .unwrap_err();
    assert!(
        err.contains("is outside the session's working directory"),
        "{err}"
    );
}

#[tokio::test]
async fn without_allowed_roots_the_refusal_names_only_the_working_directory() {
    let t = T::with(|c| {
        c.allowed_roots.clear();
        c.read_only_roots.clear();
    });
    let err = t
        .call("read", json!({"file_path": "/etc/hostname"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "read: path \"/etc/hostname\" is outside the session's working directory"
    );
}

#[tokio::test]
async fn a_root_that_is_a_single_file_grants_that_file_only() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("shared/one.txt"), "one");
    write(&dir.path().join("shared/two.txt"), "two");
    let t = T::with(|c| c.allowed_roots = vec![dir.path().join("shared/one.txt")]);
    let one = dir.path().join("shared/one.txt").display().to_string();
    let two = dir.path().join("shared/two.txt").display().to_string();
    assert_eq!(
        t.call("read", json!({"file_path": one})).await.unwrap(),
        "one"
    );
    assert!(
        t.call("read", json!({"file_path": two}))
            .await
            .unwrap_err()
            .contains("outside")
    );
}

#[tokio::test]
async fn slash_as_a_root_grants_everything() {
    let t = T::with(|c| c.allowed_roots = vec![PathBuf::from("/")]);
    write(&t.p("outside/x"), "x");
    assert_eq!(
        t.call("read", json!({"file_path": t.s("outside/x")}))
            .await
            .unwrap(),
        "x"
    );
}

#[tokio::test]
async fn an_empty_root_entry_grants_nothing() {
    let t = T::with(|c| c.allowed_roots = vec![PathBuf::new()]);
    write(&t.p("outside/x"), "x");
    let err = t
        .call("read", json!({"file_path": t.s("outside/x")}))
        .await
        .unwrap_err();
    assert!(err.contains("outside"), "{err}");
    // The process's current directory is not granted either.
    let cwd = std::env::current_dir().unwrap().join("Cargo.toml");
    let err = t
        .call("read", json!({"file_path": cwd.display().to_string()}))
        .await
        .unwrap_err();
    assert!(err.contains("outside"), "{err}");
}

#[tokio::test]
async fn a_sibling_sharing_a_string_prefix_with_a_root_is_outside() {
    let t = T::new();
    write(&t.p("mem-old/n.md"), "old");
    write(&t.p("workshop/n.md"), "shop");
    for p in [t.s("mem-old/n.md"), t.s("workshop/n.md")] {
        let err = t.call("read", json!({"file_path": p})).await.unwrap_err();
        assert!(err.contains("outside"), "{err}");
    }
}

#[tokio::test]
async fn a_symlink_leaving_the_workdir_is_refused_even_dangling() {
    let t = T::new();
    write(&t.p("outside/secret"), "no");
    symlink(t.p("outside/secret"), t.p("work/link")).unwrap();
    symlink(t.p("outside/not-yet"), t.p("work/dangling")).unwrap();
    symlink(t.p("outside"), t.p("work/dirlink")).unwrap();
    // Every link is followed (the leaf and a dangling one included), and
    // where it leads is what is checked, in the reference's words.
    for p in ["link", "dirlink/secret"] {
        let err = t.call("read", json!({"file_path": p})).await.unwrap_err();
        assert_eq!(
            err,
            format!(
                "read: path {p:?} is outside the session's working directory and its other permitted directories"
            )
        );
    }
    // Writing through a dangling symlink would create the file outside.
    let err = t
        .call("write", json!({"file_path": "dangling", "content": "x"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "write: path \"dangling\" is outside the session's working directory and its other permitted directories"
    );
    assert!(!t.p("outside/not-yet").exists());
}

#[tokio::test]
async fn a_symlink_inside_the_workdir_is_followed() {
    // Since issue 24 the tools follow a link that stays inside the roots,
    // as the reference does (before, issue 12 refused every link).
    let t = T::new();
    write(&t.p("work/real.txt"), "real");
    symlink("real.txt", t.p("work/alias.txt")).unwrap();
    assert_eq!(
        t.call("read", json!({"file_path": "alias.txt"}))
            .await
            .unwrap(),
        "real"
    );
    // Written through, the target changes and the link stays a link.
    t.call("write", json!({"file_path": "alias.txt", "content": "new"}))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(t.p("work/real.txt")).unwrap(),
        "new"
    );
    assert!(
        t.p("work/alias.txt")
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[tokio::test]
async fn a_symlinked_read_only_root_still_refuses_writes() {
    let t = T::new();
    write(&t.p("kb/faq.md"), "Q");
    // An alias of the read-only store inside the workdir, and a root given by its alias.
    symlink(t.p("kb"), t.p("work/kb-alias")).unwrap();
    let err = t
        .call(
            "write",
            json!({"file_path": "kb-alias/faq.md", "content": "changed"}),
        )
        .await
        .unwrap_err();
    // The alias is followed; where it leads is read-only.
    assert_eq!(
        err,
        format!(
            "write: kb-alias/faq.md is inside read-only directory {}",
            t.s("kb")
        )
    );
    let err = t
        .call(
            "edit",
            json!({"file_path": "kb-alias/faq.md", "old_string": "Q", "new_string": "A"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "edit: kb-alias/faq.md is inside read-only directory {}",
            t.s("kb")
        )
    );
    // Moved under the workdir by the agent's shell, the store stays read-only.
    std::fs::rename(t.p("kb"), t.p("work/kb-moved")).unwrap();
    let err = t
        .call(
            "write",
            json!({"file_path": "kb-moved/faq.md", "content": "changed"}),
        )
        .await
        .unwrap_err();
    assert!(
        err.starts_with("write: kb-moved/faq.md is inside read-only directory"),
        "{err}"
    );
    std::fs::rename(t.p("work/kb-moved"), t.p("kb")).unwrap();
    assert_eq!(std::fs::read_to_string(t.p("kb/faq.md")).unwrap(), "Q");

    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("real-kb/a.md"), "a");
    symlink(dir.path().join("real-kb"), dir.path().join("kb-link")).unwrap();
    let t2 = T::with(|c| {
        c.allowed_roots = vec![dir.path().join("real-kb")];
        c.read_only_roots = vec![dir.path().join("kb-link")];
    });
    let target = dir.path().join("real-kb/a.md").display().to_string();
    let err = t2
        .call("write", json!({"file_path": target, "content": "b"}))
        .await
        .unwrap_err();
    assert!(err.contains("is inside read-only directory"), "{err}");
    // Reading a read-only store is fine.
    assert_eq!(
        t.call("read", json!({"file_path": t.s("kb/faq.md")}))
            .await
            .unwrap(),
        "Q"
    );
}

#[tokio::test]
async fn symlink_loops_give_a_clean_error_without_leaking_the_workdir() {
    let t = T::new();
    symlink(t.p("work/b"), t.p("work/a")).unwrap();
    symlink(t.p("work/a"), t.p("work/b")).unwrap();
    symlink("self", t.p("work/self")).unwrap();
    for (tool, input) in [
        ("read", json!({"file_path": "a"})),
        ("write", json!({"file_path": "a/x", "content": "x"})),
        ("read", json!({"file_path": "self"})),
    ] {
        let err = t.call(tool, input).await.unwrap_err();
        assert!(
            err.ends_with(": too many levels of symbolic links"),
            "{err}"
        );
        assert!(!err.contains(&t.s("work")), "leaks the workdir: {err}");
    }
}

#[tokio::test]
async fn refusals_are_tool_errors_not_panics_or_io_errors() {
    let t = T::new();
    let r = t
        .tools
        .run(
            "read",
            json!({"file_path": "/etc/passwd"}),
            Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert!(matches!(r, Err(ToolError { .. })));
    // Bad input is a tool error too.
    let err = t.call("read", json!({"path": "x"})).await.unwrap_err();
    assert!(err.starts_with("read: invalid input:"), "{err}");
}

// ---- read ----

#[tokio::test]
async fn read_returns_a_line_range() {
    let t = T::new();
    write(&t.p("work/f.txt"), "one\ntwo\nthree\nfour");
    assert_eq!(
        t.call("read", json!({"file_path": "f.txt", "view_range": [2, 3]}))
            .await
            .unwrap(),
        "two\nthree"
    );
    assert_eq!(
        t.call("read", json!({"file_path": "f.txt", "view_range": [3, -1]}))
            .await
            .unwrap(),
        "three\nfour"
    );
    assert_eq!(
        t.call("read", json!({"file_path": "f.txt", "view_range": [9, 10]}))
            .await
            .unwrap(),
        ""
    );
    let err = t
        .call("read", json!({"file_path": "f.txt", "view_range": [1]}))
        .await
        .unwrap_err();
    assert_eq!(err, "read: view_range must be [start_line, end_line]");
}

#[tokio::test]
async fn read_refuses_a_file_over_the_cap_with_the_hint_and_streams_a_range_of_it() {
    let t = T::new();
    let line = "x".repeat(99) + "\n";
    write(&t.p("work/big.txt"), &line.repeat(3000)); // 300,000 bytes
    let err = t
        .call("read", json!({"file_path": "big.txt"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "read: big.txt is 300000 bytes, exceeds 262144-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
    );
    let got = t
        .call(
            "read",
            json!({"file_path": "big.txt", "view_range": [2999, 3000]}),
        )
        .await
        .unwrap();
    assert_eq!(got, format!("{}\n{}", "x".repeat(99), "x".repeat(99)));
    let err = t
        .call(
            "read",
            json!({"file_path": "big.txt", "view_range": [1, 0]}),
        )
        .await
        .unwrap_err();
    assert!(
        err.contains("exceeds 262144-byte limit. Narrow the view_range"),
        "{err}"
    );
    write(&t.p("work/one-line.txt"), &"y".repeat(300_000));
    let err = t
        .call(
            "read",
            json!({"file_path": "one-line.txt", "view_range": [1, 1]}),
        )
        .await
        .unwrap_err();
    assert!(
        err.starts_with("read: line 1 of one-line.txt alone exceeds 262144-byte limit."),
        "{err}"
    );
}

#[tokio::test]
async fn read_refuses_non_regular_files_without_blocking() {
    let t = T::new();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        t.p("work/fifo"),
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let err = t
        .call("read", json!({"file_path": "fifo"}))
        .await
        .unwrap_err();
    assert_eq!(err, "read: fifo: not a regular file");
    assert!(started.elapsed() < Duration::from_secs(2));
    let err = t.call("read", json!({"file_path": "."})).await.unwrap_err();
    assert_eq!(err, "read: .: not a regular file");
    let err = t
        .call("read", json!({"file_path": "missing.txt"}))
        .await
        .unwrap_err();
    assert_eq!(err, "read: missing.txt: no such file or directory");
}

#[tokio::test]
async fn read_refuses_binary_text_and_returns_images_as_blocks() {
    let t = T::new();
    std::fs::write(t.p("work/bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
    let err = t
        .call("read", json!({"file_path": "bin.dat"}))
        .await
        .unwrap_err();
    assert!(
        err.starts_with("read: bin.dat: not valid UTF-8 text"),
        "{err}"
    );
    std::fs::write(t.p("work/pic.PNG"), [0x89, b'P', b'N', b'G']).unwrap();
    let out = t
        .tools
        .run(
            "read",
            json!({"file_path": "pic.PNG"}),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    let ToolOutput::Blocks(blocks) = out else {
        panic!("expected blocks")
    };
    assert_eq!(blocks[0]["type"], "image");
    assert_eq!(blocks[0]["source"]["media_type"], "image/png");
    assert_eq!(blocks[0]["source"]["data"], "iVBORw==");
    let err = t
        .call(
            "read",
            json!({"file_path": "pic.PNG", "view_range": [1, 2]}),
        )
        .await
        .unwrap_err();
    assert_eq!(err, "read: view_range is not supported for image/PDF files");
}

// ---- write and edit ----

#[tokio::test]
async fn write_creates_parents_atomically_and_counts_bytes() {
    let t = T::new();
    let out = t
        .call(
            "write",
            json!({"file_path": "deep/er/f.txt", "content": "héllo"}),
        )
        .await
        .unwrap();
    assert_eq!(out, "wrote 6 bytes to deep/er/f.txt");
    assert_eq!(
        std::fs::read_to_string(t.p("work/deep/er/f.txt")).unwrap(),
        "héllo"
    );
    let mode = std::fs::metadata(t.p("work/deep/er/f.txt"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(t.p("work/deep/er"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["f.txt"]);
    // An existing file keeps its mode.
    std::fs::set_permissions(
        t.p("work/deep/er/f.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    t.call(
        "write",
        json!({"file_path": "deep/er/f.txt", "content": "again"}),
    )
    .await
    .unwrap();
    let mode = std::fs::metadata(t.p("work/deep/er/f.txt"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let err = t
        .call("write", json!({"file_path": "deep", "content": "x"}))
        .await
        .unwrap_err();
    assert_eq!(err, "write: deep: is a directory");
}

#[tokio::test]
async fn write_into_a_writable_memory_root_works_and_a_read_only_one_refuses() {
    let t = T::new();
    t.call(
        "write",
        json!({"file_path": t.s("mem/new.md"), "content": "n"}),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read_to_string(t.p("mem/new.md")).unwrap(), "n");
    let err = t
        .call(
            "write",
            json!({"file_path": t.s("kb/new.md"), "content": "n"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "write: {} is inside read-only directory {}",
            t.s("kb/new.md"),
            t.s("kb")
        )
    );
    assert!(!t.p("kb/new.md").exists());
}

#[tokio::test]
async fn edit_needs_a_unique_match_unless_replace_all() {
    let t = T::new();
    write(&t.p("work/e.txt"), "a b a $1");
    let err = t
        .call(
            "edit",
            json!({"file_path": "e.txt", "old_string": "a", "new_string": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "edit: old_string appears 2 times in e.txt (must be unique)"
    );
    let err = t
        .call(
            "edit",
            json!({"file_path": "e.txt", "old_string": "zzz", "new_string": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err, "edit: old_string not found in e.txt");
    let err = t
        .call(
            "edit",
            json!({"file_path": "e.txt", "old_string": "", "new_string": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err, "edit: old_string must not be empty");
    let out = t
        .call("edit", json!({"file_path": "e.txt", "old_string": "a", "new_string": "$&-$0", "replace_all": true}))
        .await
        .unwrap();
    assert_eq!(out, "edited e.txt (2 replacement(s))");
    assert_eq!(
        std::fs::read_to_string(t.p("work/e.txt")).unwrap(),
        "$&-$0 b $&-$0 $1"
    );
    let out = t
        .call(
            "edit",
            json!({"file_path": "e.txt", "old_string": "b", "new_string": "c"}),
        )
        .await
        .unwrap();
    assert_eq!(out, "edited e.txt (1 replacement(s))");
    let err = t
        .call(
            "edit",
            json!({"file_path": "nope.txt", "old_string": "a", "new_string": "b"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err, "edit: nope.txt: no such file or directory");
}

// ---- glob ----

fn touch_at(path: &Path, secs_ago: u64) {
    write(path, "x");
    let t = std::time::SystemTime::now() - Duration::from_secs(secs_ago);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[tokio::test]
async fn glob_matches_at_any_depth_newest_first() {
    let t = T::new();
    touch_at(&t.p("work/a.rs"), 30);
    touch_at(&t.p("work/src/b.rs"), 10);
    touch_at(&t.p("work/src/deep/c.rs"), 20);
    touch_at(&t.p("work/src/d.txt"), 0);
    touch_at(&t.p("work/.git/e.rs"), 0);
    let out = t.call("glob", json!({"pattern": "**/*.rs"})).await.unwrap();
    let w = t.s("work");
    assert_eq!(out, format!("{w}/src/b.rs\n{w}/src/deep/c.rs\n{w}/a.rs"));
    let out = t.call("glob", json!({"pattern": "*.rs"})).await.unwrap();
    assert_eq!(out, format!("{w}/a.rs"));
    let out = t.call("glob", json!({"pattern": "*.md"})).await.unwrap();
    assert_eq!(out, "no matches");
    let out = t
        .call("glob", json!({"pattern": "*.rs", "path": "src"}))
        .await
        .unwrap();
    assert_eq!(out, format!("{w}/src/b.rs"));
}

#[tokio::test]
async fn glob_refuses_absolute_and_parent_patterns_and_never_leaves_its_root() {
    let t = T::new();
    let err = t
        .call("glob", json!({"pattern": "/etc/*"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "glob: absolute pattern not permitted; pass a relative pattern (and optionally path)"
    );
    let err = t
        .call("glob", json!({"pattern": "../outside/*"}))
        .await
        .unwrap_err();
    assert_eq!(err, "glob: '..' is not permitted in the pattern");
    let err = t
        .call("glob", json!({"pattern": "*", "path": t.s("outside")}))
        .await
        .unwrap_err();
    assert!(
        err.contains("outside the session's working directory"),
        "{err}"
    );
    write(&t.p("outside/secret.txt"), "s");
    symlink(t.p("outside"), t.p("work/escape")).unwrap();
    symlink(t.p("outside/secret.txt"), t.p("work/leak.txt")).unwrap();
    let out = t
        .call("glob", json!({"pattern": "**/*.txt"}))
        .await
        .unwrap();
    assert_eq!(out, "no matches");
}

#[tokio::test]
async fn glob_caps_its_result_at_200_paths() {
    let t = T::new();
    for i in 0..250 {
        write(&t.p(&format!("work/many/{i:03}.txt")), "x");
    }
    let out = t
        .call("glob", json!({"pattern": "many/*.txt"}))
        .await
        .unwrap();
    assert_eq!(out.lines().count(), 200);
}

// ---- grep ----

#[tokio::test]
async fn grep_prints_file_line_text_for_each_match() {
    let t = T::new();
    write(&t.p("work/a.txt"), "alpha\nbeta\ngamma beta\n");
    write(&t.p("work/sub/b.txt"), "no\nbetamax\n");
    let out = t.call("grep", json!({"pattern": "^bet"})).await.unwrap();
    let w = t.s("work");
    assert_eq!(out, format!("{w}/a.txt:2:beta\n{w}/sub/b.txt:2:betamax"));
    let out = t
        .call("grep", json!({"pattern": "gamma", "path": "a.txt"}))
        .await
        .unwrap();
    assert_eq!(out, format!("{w}/a.txt:3:gamma beta"));
    assert_eq!(
        t.call("grep", json!({"pattern": "zeta"})).await.unwrap(),
        "no matches"
    );
    let err = t
        .call("grep", json!({"pattern": "(unclosed"}))
        .await
        .unwrap_err();
    assert!(err.starts_with("grep: invalid regex:"), "{err}");
}

#[tokio::test]
async fn grep_skips_binaries_long_lines_symlinks_fifos_and_git() {
    let t = T::new();
    std::fs::write(t.p("work/bin"), b"needle\0needle").unwrap();
    write(
        &t.p("work/long.txt"),
        &format!("needle{}\nshort needle\n", "x".repeat(2_100)),
    );
    write(&t.p("work/.git/config"), "needle");
    write(&t.p("outside/s.txt"), "needle");
    symlink(t.p("outside/s.txt"), t.p("work/link.txt")).unwrap();
    symlink(t.p("outside"), t.p("work/dirlink")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        t.p("work/fifo"),
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let out = t.call("grep", json!({"pattern": "needle"})).await.unwrap();
    assert_eq!(out, format!("{}/long.txt:2:short needle", t.s("work")));
}

#[tokio::test]
async fn grep_output_is_capped_at_100_kib() {
    let t = T::new();
    write(
        &t.p("work/many.txt"),
        &"match this line please\n".repeat(20_000),
    );
    let out = t.call("grep", json!({"pattern": "match"})).await.unwrap();
    assert!(
        out.ends_with("\n[output truncated at 102400 bytes]"),
        "{}",
        &out[out.len() - 80..]
    );
    assert!(out.len() <= 102_400 + 64);
}

// ---- bash ----

#[tokio::test]
async fn bash_keeps_cwd_and_variables_between_calls() {
    let t = T::new();
    t.call(
        "bash",
        json!({"command": "mkdir -p sub && cd sub && export GREETING=hi"}),
    )
    .await
    .unwrap();
    let out = t
        .call("bash", json!({"command": "pwd; echo $GREETING"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        format!(
            "{}/sub\nhi",
            std::fs::canonicalize(t.p("work")).unwrap().display()
        )
    );
}

#[tokio::test]
async fn bash_merges_stderr_and_fails_with_the_output_or_the_status() {
    let t = T::new();
    assert_eq!(
        t.call("bash", json!({"command": "echo out; echo err >&2"}))
            .await
            .unwrap(),
        "out\nerr"
    );
    assert_eq!(
        t.call(
            "bash",
            json!({"command": "echo bad; exit_code() { return 3; }; exit_code"})
        )
        .await
        .unwrap_err(),
        "bad"
    );
    assert_eq!(
        t.call("bash", json!({"command": "false"}))
            .await
            .unwrap_err(),
        "exit 1"
    );
    assert_eq!(
        t.call("bash", json!({"command": "true"})).await.unwrap(),
        ""
    );
    let content = ToolOutput::Text(String::new()).into_content();
    assert_eq!(
        content,
        vec![json!({"type": "text", "text": "(no output)"})]
    );
    // The shell's own syntax errors reach the output too.
    let err = t
        .call("bash", json!({"command": "if then fi"}))
        .await
        .unwrap_err();
    assert!(err.contains("syntax error"), "{err}");
    // And the shell still works afterwards.
    assert_eq!(
        t.call("bash", json!({"command": "echo fine"}))
            .await
            .unwrap(),
        "fine"
    );
}

#[tokio::test]
async fn bash_gives_commands_no_stdin_strips_ansi_and_trailing_newlines() {
    let t = T::new();
    let started = std::time::Instant::now();
    assert_eq!(
        t.call("bash", json!({"command": "cat; echo done"}))
            .await
            .unwrap(),
        "done"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let out = t
        .call(
            "bash",
            json!({"command": r"printf '\033[31mred\033[0m\n\n\n'"}),
        )
        .await
        .unwrap();
    assert_eq!(out, "red");
}

#[tokio::test]
async fn bash_output_cannot_forge_the_end_of_a_command() {
    let t = T::new();
    let out = t
        .call("bash", json!({"command": "echo '__ANT_CMD_00000000000000000000000000000000_DONE__0'; echo after"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        "__ANT_CMD_00000000000000000000000000000000_DONE__0\nafter"
    );
}

#[tokio::test]
async fn bash_caps_output_at_100_kib_keeping_the_tail() {
    let t = T::new();
    let out = t
        .call("bash", json!({"command": "seq 1 100000; echo last-line"}))
        .await
        .unwrap();
    assert!(out.starts_with("[output truncated]\n"), "{}", &out[..40]);
    assert!(out.ends_with("100000\nlast-line"));
    assert!(out.len() <= 100 * 1024 + 32, "{}", out.len());
}

#[tokio::test]
async fn bash_times_out_kills_the_shell_and_the_next_call_gets_a_fresh_one() {
    let t = T::new();
    t.call(
        "bash",
        json!({"command": "export STATE=old; (sleep 30; touch late) &"}),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let err = t
        .call("bash", json!({"command": "sleep 30", "timeout_ms": 300}))
        .await
        .unwrap_err();
    assert_eq!(err, "bash: bash command timed out after 300ms");
    assert!(started.elapsed() < Duration::from_secs(5));
    let out = t
        .call("bash", json!({"command": "echo \"state=$STATE\""}))
        .await
        .unwrap();
    assert_eq!(out, "state=", "a fresh shell has none of the old variables");
}

#[tokio::test]
async fn the_call_deadline_bounds_a_command_without_its_own_timeout() {
    let t = T::new();
    let started = std::time::Instant::now();
    let err = t
        .call_for(
            "bash",
            json!({"command": "sleep 30"}),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(
        err.starts_with("bash: bash command timed out after 2")
            || err == "bash: bash command timed out after 300ms",
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn bash_restart_and_required_command() {
    let t = T::new();
    t.call("bash", json!({"command": "export X=1"}))
        .await
        .unwrap();
    assert_eq!(
        t.call("bash", json!({"restart": true})).await.unwrap(),
        "bash session restarted"
    );
    assert_eq!(
        t.call("bash", json!({"command": "echo x=$X"}))
            .await
            .unwrap(),
        "x="
    );
    assert_eq!(
        t.call("bash", json!({})).await.unwrap_err(),
        "bash: command is required"
    );
}

#[tokio::test]
async fn a_shell_that_exits_is_replaced_on_the_next_call() {
    let t = T::new();
    let err = t
        .call("bash", json!({"command": "echo bye; exit 4"}))
        .await
        .unwrap_err();
    assert!(err.starts_with("bash: the shell exited"), "{err}");
    assert!(err.contains("bye"), "{err}");
    assert_eq!(
        t.call("bash", json!({"command": "echo back"}))
            .await
            .unwrap(),
        "back"
    );
}

#[tokio::test]
async fn closing_the_toolset_kills_background_jobs() {
    use envworker::tools::ToolHandler;
    let t = T::new();
    let marker = t.p("work/still-running");
    t.call(
        "bash",
        json!({"command": format!("(sleep 1; touch {}) >/dev/null 2>&1 &", marker.display())}),
    )
    .await
    .unwrap();
    t.tools.close().await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !marker.exists(),
        "the background job was killed with the shell"
    );
}

#[tokio::test]
async fn a_cancelled_call_kills_its_command() {
    let t = T::new();
    let marker = t.p("work/finished");
    let call = t.call(
        "bash",
        json!({"command": format!("sleep 1; touch {}", marker.display())}),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), call)
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !marker.exists(),
        "the cancelled command did not go on running"
    );
    assert_eq!(
        t.call("bash", json!({"command": "echo ok"})).await.unwrap(),
        "ok"
    );
}

#[test]
fn the_shell_environment_drops_every_credential() {
    let vars = [
        ("PATH", "/bin"),
        ("HOME", "/home/agent"),
        ("ANTHROPIC_API_KEY", "sk-ant"),
        ("ANTHROPIC_ENVIRONMENT_KEY", "envkey"),
        ("ANTHROPIC_WORK_SECRET", "secret"),
        ("ENVWORKER_ADMIN_KEY", "admin"),
        ("AWS_SECRET_ACCESS_KEY", "aws"),
        ("AWS_SESSION_TOKEN", "aws"),
        ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
        (
            "_X_AMZN_TRACE_ID",
            "Root=1-5759e988-bd862e3fe1be46a994272793",
        ),
        ("MY_WEBHOOK_KEY", "whsec_x"),
        // The worker's collector and its credentials (a vendor's key).
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team=key"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "authorization=Bearer t",
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
        ("OTEL_SERVICE_NAME", "envworker"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let kept = scrub(vars.into_iter(), &["MY_WEBHOOK_KEY".to_string()]);
    let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["PATH", "HOME"]);
}

#[tokio::test]
async fn bash_sees_exactly_the_environment_it_was_given() {
    let t = T::with(|c| {
        c.bash_env = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("ONLY".into(), "me".into()),
        ]
    });
    let out = t.call("bash", json!({"command": "env | grep -v '^_=' | grep -v '^PWD=' | grep -v '^SHLVL=' | grep -v '^OLDPWD=' | sort"})).await.unwrap();
    assert_eq!(out, "ONLY=me\nPATH=/usr/bin:/bin\nTERM=dumb");
}
