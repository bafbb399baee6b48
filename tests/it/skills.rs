//! Skills: download into `<workdir>/skills/<name>/` over real HTTP against an
//! in-process devserver, hostile archives included, and the devserver's
//! skill endpoints themselves.

use std::io::{Cursor, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::harness::Logs;
use crate::common::{ADMIN_KEY, Answer, TestServer};
use base64::Engine;
use envworker::api::types::Session;
use envworker::api::{Client, Credential};
use envworker::skills::{download_session_skills, remove_skills};
use reqwest::Method;
use serde_json::{Value, json};

const SKILLS_BETA: &str = "skills-2025-10-02";

fn client(server: &TestServer) -> Client {
    Client::builder(Credential::api_key(ADMIN_KEY))
        .base_url(server.url())
        .build()
        .unwrap()
}

/// A session whose agent has these skills: `(skill_id, version)`.
fn session(skills: &[(&str, &str)]) -> Session {
    let skills: Vec<Value> = skills
        .iter()
        .map(|(id, v)| json!({"type": "custom", "skill_id": id, "version": v, "extra": 1}))
        .collect();
    serde_json::from_value(json!({
        "id": "sesn_test", "type": "session", "status": "running", "environment_id": "env_test",
        "agent": {"tools": [], "skills": skills}, "resources": [], "metadata": {},
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"
    }))
    .unwrap()
}

/// Upload through `POST /dev/skills`; the answer.
async fn upload(server: &TestServer, body: Value) -> Value {
    server
        .dev(Method::POST, "/dev/skills", Some(body))
        .await
        .ok()
}

/// Upload raw archive bytes.
async fn upload_raw(server: &TestServer, name: &str, bytes: &[u8]) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    upload(server, json!({"name": name, "archive_base64": encoded})).await
}

fn id(answer: &Value) -> String {
    answer["skill_id"].as_str().unwrap().to_string()
}

/// A typical bundle: `SKILL.md`, an executable script, a nested plain file.
fn bundle_files() -> Value {
    json!({
        "SKILL.md": "---\nname: pdf\n---\nUse the scripts.\n",
        "scripts/run.sh": {"content": "#!/bin/sh\necho ok\n", "executable": true},
        "reference/notes.txt": {"content": "notes", "executable": false},
    })
}

/// A temporary directory holding `work/` (the workdir); anything the skills
/// write outside the workdir would land beside it.
struct Dirs {
    tmp: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("work")).unwrap();
        Dirs { tmp }
    }

    fn work(&self) -> PathBuf {
        std::fs::canonicalize(self.tmp.path().join("work")).unwrap()
    }

    fn skills(&self) -> PathBuf {
        self.work().join("skills")
    }

    /// Every path under the temporary directory, relative to it.
    fn tree(&self) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(base).unwrap().display().to_string());
                if path.symlink_metadata().unwrap().is_dir() {
                    walk(base, &path, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self.tmp.path(), self.tmp.path(), &mut out);
        out.sort();
        out
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The checks every well-formed bundle passes once installed in `dir`.
#[track_caller]
fn assert_bundle_installed(dir: &Path) {
    assert_eq!(
        std::fs::read_to_string(dir.join("SKILL.md")).unwrap(),
        "---\nname: pdf\n---\nUse the scripts.\n"
    );
    assert!(
        !dir.join("pdf").exists(),
        "the wrapper directory is stripped"
    );
    assert_eq!(mode(&dir.join("scripts/run.sh")), 0o755, "exec bit kept");
    assert_eq!(mode(&dir.join("SKILL.md")), 0o644);
    assert_eq!(mode(&dir.join("reference/notes.txt")), 0o644);
    let output = std::process::Command::new(dir.join("scripts/run.sh"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

/// Upload the bundle as `format`, download it, check it.
async fn install_bundle_as(format: &str) {
    let server = TestServer::start().await;
    let skill = upload(
        &server,
        json!({"name": "pdf", "description": "PDFs", "files": bundle_files(), "format": format}),
    )
    .await;
    let dirs = Dirs::new();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed, vec![dirs.skills().join("pdf")]);
    assert_bundle_installed(&dirs.skills().join("pdf"));
    assert_eq!(mode(&dirs.skills()), 0o700, "the skills root is owner-only");
    let leftovers: Vec<_> = dirs
        .tree()
        .into_iter()
        .filter(|p| p.contains(".skill-"))
        .collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");
}

#[tokio::test]
async fn zip_with_a_wrapper_dir_lands_directly_in_the_skill_dir() {
    install_bundle_as("zip").await;
}

#[tokio::test]
async fn plain_tar_installs_like_zip() {
    install_bundle_as("tar").await;
}

#[tokio::test]
async fn gzip_tar_installs_like_zip() {
    install_bundle_as("tar.gz").await;
}

#[tokio::test]
async fn bzip2_tar_installs_like_zip() {
    install_bundle_as("tar.bz2").await;
}

#[tokio::test]
async fn an_unwrapped_bundle_installs_as_is() {
    let server = TestServer::start().await;
    let skill = upload(
        &server,
        json!({"name": "pdf", "files": bundle_files(), "wrap": false}),
    )
    .await;
    let dirs = Dirs::new();
    download_session_skills(
        &client(&server),
        &session(&[(&id(&skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_bundle_installed(&dirs.skills().join("pdf"));
}

#[tokio::test]
async fn an_agent_without_skills_leaves_no_directory() {
    let server = TestServer::start().await;
    let dirs = Dirs::new();
    let installed = download_session_skills(&client(&server), &session(&[]), &dirs.work()).await;
    assert!(installed.is_empty());
    assert!(!dirs.skills().exists());
}

#[tokio::test]
async fn latest_resolves_to_the_newest_version_and_a_pinned_version_stays() {
    let server = TestServer::start().await;
    let first = upload(
        &server,
        json!({"name": "notes", "files": {"SKILL.md": "one"}}),
    )
    .await;
    let skill_id = id(&first);
    let second = upload(
        &server,
        json!({"skill_id": skill_id, "files": {"SKILL.md": "two"}}),
    )
    .await;
    assert!(
        second["version"].as_str().unwrap().parse::<i64>().unwrap()
            > first["version"].as_str().unwrap().parse::<i64>().unwrap()
    );
    let dirs = Dirs::new();
    download_session_skills(
        &client(&server),
        &session(&[(&skill_id, "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dirs.skills().join("notes/SKILL.md")).unwrap(),
        "two"
    );
    let pinned = first["version"].as_str().unwrap();
    download_session_skills(
        &client(&server),
        &session(&[(&skill_id, pinned)]),
        &dirs.work(),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dirs.skills().join("notes/SKILL.md")).unwrap(),
        "one"
    );
}

/// A zip of these entries: `(name, content, unix mode)`.
fn zip_of(entries: &[(&str, &str, u32)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, content, mode) in entries {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(*mode);
        w.start_file(*name, options).unwrap();
        w.write_all(content.as_bytes()).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// One tar member with its name written as is (the `tar` crate's path
/// setters refuse `..`, which is the point here).
enum TarMember<'a> {
    File(&'a str, &'a str),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
}

fn tar_of(members: &[TarMember<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for member in members {
        let mut h = tar::Header::new_gnu();
        let (name, data, kind, link) = match member {
            TarMember::File(name, content) => {
                (*name, content.as_bytes(), tar::EntryType::Regular, None)
            }
            TarMember::Symlink(name, to) => (*name, &b""[..], tar::EntryType::Symlink, Some(*to)),
            TarMember::Hardlink(name, to) => (*name, &b""[..], tar::EntryType::Link, Some(*to)),
        };
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(to) = link {
            h.as_gnu_mut().unwrap().linkname[..to.len()].copy_from_slice(to.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Install a good skill and a hostile one in the same session: the good one
/// lands, the hostile one fails whole (logging `reason`) and writes nothing
/// anywhere.
async fn hostile_archive_is_refused(archive: &[u8], outside: &[&Path], reason: &str) {
    let server = TestServer::start().await;
    let good = upload(&server, json!({"name": "good", "files": bundle_files()})).await;
    let bad = upload_raw(&server, "bad", archive).await;
    let dirs = Dirs::new();
    let logs = Logs::capture();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&bad), "latest"), (&id(&good), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed, vec![dirs.skills().join("good")]);
    assert_bundle_installed(&dirs.skills().join("good"));
    assert!(!dirs.skills().join("bad").exists(), "{:?}", dirs.tree());
    let tree = dirs.tree();
    assert!(
        tree.iter()
            .all(|p| !p.contains("evil") && !p.contains(".skill-")),
        "{tree:?}"
    );
    for path in outside {
        assert!(!path.exists(), "{} was written", path.display());
    }
    assert_eq!(logs.count("failed to download skill"), 1, "{}", logs.text());
    assert!(logs.text().contains(&id(&bad)), "{}", logs.text());
    assert!(logs.text().contains(reason), "{}", logs.text());
}

#[tokio::test]
async fn zip_slip_refuses_the_skill_and_the_others_install() {
    let archive = zip_of(&[
        ("bad/SKILL.md", "fine", 0o644),
        ("../evil", "escaped", 0o644),
        ("bad/../../evil2", "escaped", 0o644),
    ]);
    hostile_archive_is_refused(&archive, &[], "refusing archive member with '..' component").await;
}

#[tokio::test]
async fn tar_slip_refuses_the_skill_and_the_others_install() {
    let archive = tar_of(&[
        TarMember::File("bad/SKILL.md", "fine"),
        TarMember::File("bad/../../evil", "escaped"),
    ]);
    hostile_archive_is_refused(&archive, &[], "refusing archive member with '..' component").await;
}

#[tokio::test]
async fn a_skipped_member_with_a_hostile_name_still_refuses_the_archive() {
    // Every member name is screened, even of members that would be skipped.
    let archive = tar_of(&[
        TarMember::File("bad/SKILL.md", "fine"),
        TarMember::Symlink("bad/../../evil-link", "/etc/passwd"),
    ]);
    hostile_archive_is_refused(&archive, &[], "refusing archive member with '..' component").await;
    let absolute = tar_of(&[
        TarMember::File("bad/SKILL.md", "fine"),
        TarMember::Hardlink("/evil-hard", "bad/SKILL.md"),
    ]);
    hostile_archive_is_refused(&absolute, &[], "refusing archive member with absolute path").await;
}

#[tokio::test]
async fn absolute_members_refuse_the_skill() {
    let target = tempfile::tempdir().unwrap();
    let absolute = target.path().join("evil-abs");
    let name = absolute.to_str().unwrap();
    let zip = zip_of(&[("bad/SKILL.md", "fine", 0o644), (name, "escaped", 0o644)]);
    hostile_archive_is_refused(
        &zip,
        &[&absolute],
        "refusing archive member with absolute path",
    )
    .await;
    let tar = tar_of(&[
        TarMember::File("bad/SKILL.md", "fine"),
        TarMember::File(name, "escaped"),
    ]);
    hostile_archive_is_refused(
        &tar,
        &[&absolute],
        "refusing archive member with absolute path",
    )
    .await;
}

#[tokio::test]
async fn symlink_and_hardlink_entries_are_skipped() {
    let server = TestServer::start().await;
    let tar = tar_of(&[
        TarMember::File("links/SKILL.md", "fine"),
        TarMember::Symlink("links/passwd", "/etc/passwd"),
        TarMember::Symlink("links/up", "../../.."),
        TarMember::Hardlink("links/hard", "/etc/passwd"),
        TarMember::Hardlink("links/hard2", "links/SKILL.md"),
    ]);
    let tar_skill = upload_raw(&server, "links", &tar).await;
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    w.start_file("zlinks/SKILL.md", options).unwrap();
    w.write_all(b"fine").unwrap();
    w.add_symlink("zlinks/passwd", "/etc/passwd", options)
        .unwrap();
    let zip = w.finish().unwrap().into_inner();
    let zip_skill = upload_raw(&server, "zlinks", &zip).await;

    let dirs = Dirs::new();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&tar_skill), "latest"), (&id(&zip_skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed.len(), 2);
    for name in ["links", "zlinks"] {
        let dir = dirs.skills().join(name);
        assert_eq!(
            std::fs::read_to_string(dir.join("SKILL.md")).unwrap(),
            "fine"
        );
        let mut listed: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        listed.sort();
        assert_eq!(listed, ["SKILL.md"], "only the regular file of {name}");
    }
}

#[tokio::test]
async fn hostile_names_reduce_to_one_safe_component() {
    let server = TestServer::start().await;
    let mut ids = Vec::new();
    for name in ["../../x", ".", "", " .. "] {
        let skill = upload(
            &server,
            json!({"name": name, "files": {"SKILL.md": name}, "wrap": false}),
        )
        .await;
        ids.push(id(&skill));
    }
    let refs: Vec<(&str, &str)> = ids.iter().map(|i| (i.as_str(), "latest")).collect();
    let dirs = Dirs::new();
    let installed = download_session_skills(&client(&server), &session(&refs), &dirs.work()).await;
    assert_eq!(
        installed,
        vec![
            dirs.skills().join("x"),
            dirs.skills().join(&ids[1]),
            dirs.skills().join(&ids[2]),
            dirs.skills().join(&ids[3]),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(dirs.skills().join("x/SKILL.md")).unwrap(),
        "../../x"
    );
    assert!(!dirs.tmp.path().join("x").exists());
    assert!(!dirs.work().join("x").exists());
}

#[tokio::test]
async fn a_destination_resolving_outside_the_skills_dir_is_skipped() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let outside = dirs.tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), "keep").unwrap();
    std::fs::create_dir(dirs.skills()).unwrap();
    std::os::unix::fs::symlink(&outside, dirs.skills().join("pdf")).unwrap();
    let logs = Logs::capture();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert!(installed.is_empty());
    assert!(logs.count("escapes the skills dir") == 1, "{}", logs.text());
    assert_eq!(
        std::fs::read_to_string(outside.join("precious")).unwrap(),
        "keep"
    );
    assert!(!outside.join("SKILL.md").exists());
}

#[tokio::test]
async fn a_missing_skill_is_logged_and_the_others_install() {
    let server = TestServer::start().await;
    let good = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let logs = Logs::capture();
    let installed = download_session_skills(
        &client(&server),
        &session(&[("skill_01missing", "latest"), (&id(&good), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed, vec![dirs.skills().join("pdf")]);
    assert_bundle_installed(&dirs.skills().join("pdf"));
    let failures: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("failed to download skill"))
        .map(str::to_string)
        .collect();
    assert_eq!(failures.len(), 1, "{}", logs.text());
    assert!(failures[0].contains("WARN"), "{}", failures[0]);
    assert!(
        failures[0].contains("skill_id=skill_01missing"),
        "{}",
        failures[0]
    );
    assert!(
        failures[0].contains("404 not_found_error"),
        "{}",
        failures[0]
    );
}

#[tokio::test]
async fn an_archive_over_the_entry_limit_is_refused() {
    let server = TestServer::start().await;
    let files: serde_json::Map<String, Value> = (0..10_001)
        .map(|i| (format!("f/{i:05}.txt"), json!("")))
        .collect();
    let big = upload(
        &server,
        json!({"name": "many", "files": files, "wrap": false}),
    )
    .await;
    let good = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let logs = Logs::capture();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&big), "latest"), (&id(&good), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed, vec![dirs.skills().join("pdf")]);
    assert!(!dirs.skills().join("many").exists());
    assert!(
        logs.text().contains("more than 10000 entries"),
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn remove_skills_removes_only_what_was_downloaded() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let mine = dirs.skills().join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("keep.txt"), "keep").unwrap();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed.len(), 1);
    remove_skills(&installed).await;
    assert!(!dirs.skills().join("pdf").exists());
    assert_eq!(
        std::fs::read_to_string(mine.join("keep.txt")).unwrap(),
        "keep"
    );
    // Removing again is harmless.
    remove_skills(&installed).await;
}

#[tokio::test]
async fn an_existing_destination_is_replaced() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let dest = dirs.skills().join("pdf");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("stale.txt"), "old").unwrap();
    let installed = download_session_skills(
        &client(&server),
        &session(&[(&id(&skill), "latest")]),
        &dirs.work(),
    )
    .await;
    assert_eq!(installed, vec![dest.clone()]);
    assert!(!dest.join("stale.txt").exists());
    assert_bundle_installed(&dest);
}

#[tokio::test]
async fn a_failed_update_leaves_the_previous_copy_in_place() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": bundle_files()})).await;
    let dirs = Dirs::new();
    let session = session(&[(&id(&skill), "latest")]);
    download_session_skills(&client(&server), &session, &dirs.work()).await;
    let hostile = zip_of(&[("pdf/SKILL.md", "new", 0o644), ("../evil", "x", 0o644)]);
    let encoded = base64::engine::general_purpose::STANDARD.encode(hostile);
    upload(
        &server,
        json!({"skill_id": id(&skill), "archive_base64": encoded}),
    )
    .await;
    let installed = download_session_skills(&client(&server), &session, &dirs.work()).await;
    assert!(installed.is_empty());
    assert_bundle_installed(&dirs.skills().join("pdf"));
}

// ---------------------------------------------------------------------------
// The devserver's skill endpoints.

async fn skills_get(server: &TestServer, path: &str) -> Answer {
    server
        .send(
            Method::GET,
            path,
            None,
            &[
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", SKILLS_BETA),
            ],
        )
        .await
}

#[tokio::test]
async fn devserver_unknown_skills_and_versions_are_404_in_the_envelope() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": {"SKILL.md": "x"}})).await;
    let skill_id = id(&skill);
    let version = skill["version"].as_str().unwrap();
    for path in [
        "/v1/skills/skill_01nope/versions/latest".to_string(),
        "/v1/skills/skill_01nope/versions".to_string(),
        format!("/v1/skills/{skill_id}/versions/1"),
        format!("/v1/skills/{skill_id}/versions/0{version}"),
        format!("/v1/skills/{skill_id}/versions/{version}x/content"),
        // The content endpoint takes a concrete version, never an alias.
        format!("/v1/skills/{skill_id}/versions/latest/content"),
    ] {
        skills_get(&server, &path)
            .await
            .expect_error(404, "not_found_error");
    }
}

#[tokio::test]
async fn devserver_skill_reads_need_a_credential() {
    let server = TestServer::start().await;
    let skill = upload(&server, json!({"name": "pdf", "files": {"SKILL.md": "x"}})).await;
    let path = format!("/v1/skills/{}/versions/latest", id(&skill));
    let no_key = server
        .send(
            Method::GET,
            &path,
            None,
            &[
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", SKILLS_BETA),
            ],
        )
        .await;
    no_key.expect_error(401, "authentication_error");
    let bad_key = server
        .send(
            Method::GET,
            &path,
            None,
            &[
                ("authorization", "Bearer not-a-key"),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", SKILLS_BETA),
            ],
        )
        .await;
    bad_key.expect_error(401, "authentication_error");
    let no_beta = server
        .send(
            Method::GET,
            &path,
            None,
            &[
                ("x-api-key", ADMIN_KEY),
                ("anthropic-version", "2023-06-01"),
            ],
        )
        .await;
    // The official SDK reads skills without a beta header; that works.
    assert!(no_beta.status.is_success(), "{:#}", no_beta.body);

    // Any valid credential reads: an environment key does.
    let (_, key) = server.create_environment().await;
    let auth = format!("Bearer {key}");
    let with_env_key = server
        .send(
            Method::GET,
            &path,
            None,
            &[
                ("authorization", &auth),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", SKILLS_BETA),
            ],
        )
        .await
        .ok();
    assert_eq!(with_env_key["name"], "pdf");
    let env_client = Client::builder(Credential::bearer(key))
        .base_url(server.url())
        .build()
        .unwrap();
    let version = env_client
        .skills()
        .retrieve_version(&id(&skill), "latest")
        .await
        .unwrap();
    assert_eq!(version.id, skill["version"].as_str().unwrap());
}

#[tokio::test]
async fn devserver_latest_listing_and_content() {
    let server = TestServer::start().await;
    let first = upload(
        &server,
        json!({"name": "pdf", "description": "d", "files": {"SKILL.md": "1"}}),
    )
    .await;
    assert_eq!(first["type"], "skill_version");
    assert_eq!(first["id"], first["version"]);
    assert_eq!(first["name"], "pdf");
    assert_eq!(first["description"], "d");
    assert!(first["created_at"].as_str().unwrap().ends_with('Z'));
    let skill_id = id(&first);
    let mut versions = vec![first["version"].as_str().unwrap().to_string()];
    for (n, format) in [(2, "tar"), (3, "tar.gz")] {
        let next = upload(
            &server,
            json!({"skill_id": skill_id, "files": {"SKILL.md": n.to_string()}, "format": format}),
        )
        .await;
        assert_eq!(next["name"], "pdf", "the name carries over");
        versions.push(next["version"].as_str().unwrap().to_string());
    }

    let latest = skills_get(&server, &format!("/v1/skills/{skill_id}/versions/latest"))
        .await
        .ok();
    assert_eq!(latest["id"], versions[2].as_str());
    assert_eq!(latest["skill_id"], skill_id.as_str());

    let page = skills_get(&server, &format!("/v1/skills/{skill_id}/versions?limit=2"))
        .await
        .ok();
    let ids: Vec<_> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!(versions[2]), json!(versions[1])],
        "newest first"
    );
    let next = page["next_page"].as_str().unwrap();
    let rest = skills_get(
        &server,
        &format!("/v1/skills/{skill_id}/versions?limit=2&page={next}"),
    )
    .await
    .ok();
    assert_eq!(rest["data"][0]["id"], versions[0].as_str());
    assert!(rest["next_page"].is_null());

    // Content: the archive bytes, typed by format.
    let c = client(&server);
    for (version, content_type) in [
        (&versions[0], "application/zip"),
        (&versions[1], "application/octet-stream"),
    ] {
        let response = reqwest::Client::new()
            .get(format!(
                "{}/v1/skills/{skill_id}/versions/{version}/content",
                server.url()
            ))
            .header("x-api-key", ADMIN_KEY)
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", SKILLS_BETA)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], content_type);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("archive");
        let n = c
            .skills()
            .download_version(&skill_id, version, &path, 1 << 20)
            .await
            .unwrap();
        let body = response.bytes().await.unwrap();
        assert_eq!(n, body.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), body.to_vec());
        let refused = c
            .skills()
            .download_version(&skill_id, version, &path, 10)
            .await;
        assert!(refused.is_err(), "a body over the bound is refused");
    }
    let listed = c
        .skills()
        .list_versions(&skill_id, &Default::default())
        .await
        .unwrap();
    assert_eq!(listed.data.len(), 3);
}

#[tokio::test]
async fn dev_skills_refuses_bad_bodies() {
    let server = TestServer::start().await;
    let bad = |body: Value| {
        let server = &server;
        async move {
            server
                .dev(Method::POST, "/dev/skills", Some(body))
                .await
                .expect_error(400, "invalid_request_error")
        }
    };
    bad(json!({"files": {"SKILL.md": "x"}})).await;
    bad(json!({"name": "a", "files": {"SKILL.md": "x"}, "archive_base64": "UEs="})).await;
    bad(json!({"name": "a"})).await;
    bad(json!({"name": "a", "files": {}})).await;
    bad(json!({"name": "a", "files": {"../x": "x"}})).await;
    bad(json!({"name": "a", "files": {"/x": "x"}})).await;
    bad(json!({"name": "a/b", "files": {"x": "x"}})).await;
    bad(json!({"name": "a", "files": {"x": "x"}, "format": "rar"})).await;
    bad(json!({"name": "a", "archive_base64": "not base64!"})).await;
    bad(json!({"name": "a", "archive_base64": "UEs=", "format": "zip"})).await;
    bad(json!({"name": "a", "files": {"x": "x"}, "colour": "red"})).await;

    let skill = upload(&server, json!({"name": "a", "files": {"x": "x"}})).await;
    let message = bad(json!({"skill_id": id(&skill), "name": "b", "files": {"x": "x"}})).await;
    assert!(message.contains("cannot change"), "{message}");
    server
        .dev(
            Method::POST,
            "/dev/skills",
            Some(json!({"skill_id": "skill_01nope", "files": {"x": "x"}})),
        )
        .await
        .expect_error(404, "not_found_error");

    // The admin key only.
    let (_, key) = server.create_environment().await;
    let auth = format!("Bearer {key}");
    server
        .send(
            Method::POST,
            "/dev/skills",
            Some(json!({"name": "a", "files": {"x": "x"}})),
            &[("authorization", &auth)],
        )
        .await
        .expect_error(403, "permission_error");
}
