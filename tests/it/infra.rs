//! The deployment files in `infra/` against the binary they deploy: the
//! example endpoint file loads with the crate's own loader and says what it
//! claims; every variable the container image, the Kubernetes Deployment and
//! the SAM template set is one the command line reads (or one the endpoint
//! file names); the stop grace outlasts both teardown bounds. Plain text
//! scanning is enough here: the manifests themselves are schema-checked by
//! `.ci/run` (cfn-lint, kubernetes-validate, infra/check_manifests.py).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::CommandFactory;
use envworker::cli::Cli;
use envworker::config::ServeFile;
use envworker::duration::parse_duration;
use envworker::memory::options::{DeleteMode, SyncInterval};

/// Variables the deployment files set that are not flags: the agent's home.
const NOT_FLAGS: [&str; 1] = ["HOME"];

/// A syntactically valid signing key (the value does not matter here).
const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn infra(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("infra")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(infra(path)).unwrap_or_else(|e| panic!("infra/{path}: {e}"))
}

/// `envworker serve`'s variables, as clap declares them (its own and the global ones).
fn serve_env_names() -> BTreeSet<String> {
    let cli = Cli::command();
    let serve = cli
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("a serve subcommand");
    cli.get_arguments()
        .chain(serve.get_arguments())
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

/// The default of one `serve` flag, as clap declares it.
fn serve_default(long: &str) -> String {
    let cli = Cli::command();
    let serve = cli
        .get_subcommands()
        .find(|c| c.get_name() == "serve")
        .expect("a serve subcommand");
    let arg = serve
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .unwrap_or_else(|| panic!("serve has no --{long}"));
    arg.get_default_values()
        .first()
        .unwrap_or_else(|| panic!("--{long} has no default"))
        .to_string_lossy()
        .into_owned()
}

fn secs(text: &str) -> Duration {
    parse_duration(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The environment-variable names a file's `*_env` keys point at.
fn named_variables(file: &ServeFile) -> BTreeSet<String> {
    file.endpoints
        .iter()
        .flat_map(|e| {
            e.signing_keys_env
                .iter()
                .cloned()
                .chain([e.environment_key_env.clone()])
        })
        .collect()
}

#[test]
fn the_example_endpoint_file_loads_and_says_what_it_claims() {
    let file = ServeFile::load(&infra("envworker.example.toml")).unwrap();
    assert_eq!(file.base_url.as_deref(), Some("https://api.anthropic.com"));
    let names: Vec<_> = file.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["team-a", "team-b"]);

    let vars: BTreeMap<String, String> = named_variables(&file)
        .into_iter()
        .map(|name| {
            let value = if name.contains("SIGNING") {
                KEY.to_string()
            } else {
                format!("key-of-{name}")
            };
            (name, value)
        })
        .collect();
    assert_eq!(
        vars.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "TEAM_A_ENVIRONMENT_KEY",
            "TEAM_A_SIGNING_KEY",
            "TEAM_A_SIGNING_KEY_PREVIOUS",
            "TEAM_B_ENVIRONMENT_KEY",
            "TEAM_B_SIGNING_KEY",
        ]
    );
    let endpoints = file.resolve(&|name| vars.get(name).cloned()).unwrap();

    let a = &endpoints[0];
    assert_eq!(a.name, "team-a");
    assert_eq!(a.environment_id, "env_01TeamAExampleEnvironment");
    assert_eq!(a.signing_keys.len(), 2);
    assert_eq!(a.environment_key.expose(), "key-of-TEAM_A_ENVIRONMENT_KEY");
    assert_eq!(a.workdir.as_deref(), Some(Path::new("/workspace/team-a")));
    assert_eq!(a.max_idle, Some(Some(Duration::from_secs(120))));
    assert_eq!(
        a.memory_sync_interval,
        Some(SyncInterval::every(Duration::from_secs(30)).unwrap())
    );
    assert_eq!(a.memory_sync_deletions, Some(DeleteMode::LogOnly));
    assert_eq!(a.max_concurrent_items, 1);
    assert_eq!(
        a.extra_headers,
        [("x-envworker-team".to_string(), "team-a".to_string())]
    );
    assert_eq!(
        a.secret_env_vars,
        [
            "TEAM_A_SIGNING_KEY",
            "TEAM_A_SIGNING_KEY_PREVIOUS",
            "TEAM_A_ENVIRONMENT_KEY"
        ]
    );

    // Only the required keys: everything else comes from the command line.
    let b = &endpoints[1];
    assert_eq!(b.name, "team-b");
    assert_eq!(b.environment_id, "env_01TeamBExampleEnvironment");
    assert_eq!(b.signing_keys.len(), 1);
    assert_eq!(b.environment_key.expose(), "key-of-TEAM_B_ENVIRONMENT_KEY");
    assert_eq!(b.workdir, None);
    assert_eq!(b.max_idle, None);
    assert_eq!(b.memory_sync_interval, None);
    assert_eq!(b.memory_sync_deletions, None);
    assert_eq!(b.max_concurrent_items, 1);
    assert!(b.extra_headers.is_empty());
}

/// The Deployment's container `env` names (upper-case `- name:` entries).
fn deployment_env(deployment: &str) -> Vec<String> {
    deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name: "))
        .map(str::trim)
        .filter(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(String::from)
        .collect()
}

/// The `value:` given to the Deployment's variable `name`.
fn deployment_value(deployment: &str, name: &str) -> String {
    let mut lines = deployment.lines();
    lines
        .find(|l| l.trim() == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("the Deployment does not set {name}"));
    let next = lines.next().unwrap_or_default().trim();
    next.strip_prefix("value: ")
        .unwrap_or_else(|| panic!("{name} has no literal value: {next}"))
        .trim_matches('"')
        .to_string()
}

/// The first `key: value` in `text` whose key is `key`.
fn yaml_scalar<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
}

/// The ConfigMap's `envworker.toml` block, de-indented.
fn configmap_toml(configmap: &str) -> String {
    let mut lines = configmap.lines();
    lines
        .find(|l| l.trim() == "envworker.toml: |")
        .expect("the ConfigMap holds envworker.toml");
    let block: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    block
        .iter()
        .map(|l| l.get(4..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_deployment_sets_only_variables_envworker_reads() {
    let deployment = read("k8s/deployment.yaml");
    let configmap = read("k8s/configmap.yaml");
    let cli = serve_env_names();

    // The ConfigMap is the example endpoint file (as parsed).
    let in_cluster = ServeFile::parse("configmap.yaml", &configmap_toml(&configmap)).unwrap();
    let example = ServeFile::load(&infra("envworker.example.toml")).unwrap();
    assert_eq!(format!("{in_cluster:?}"), format!("{example:?}"));

    // --config points at the mounted ConfigMap key.
    assert!(
        deployment.contains(r#"args: ["serve", "--config", "/config/envworker/envworker.toml"]"#),
        "the Deployment runs serve --config /config/envworker/envworker.toml"
    );
    assert!(deployment.contains("mountPath: /config/envworker\n"));
    // The worker's own files live outside every path a sandboxed shell is
    // granted (/etc, /tmp, the workdirs).
    assert!(deployment.contains("mountPath: /var/lib/envworker\n"));
    assert!(deployment.contains("name: envworker-config"));
    assert!(cli.contains("ENVWORKER_CONFIG"));

    // Every variable is a flag's, or one the endpoint file names; each of
    // those is filled from the Secret, never from a literal.
    let named = named_variables(&in_cluster);
    let env = deployment_env(&deployment);
    for name in &env {
        assert!(
            cli.contains(name) || named.contains(name) || NOT_FLAGS.contains(&name.as_str()),
            "the Deployment sets {name}, which envworker serve does not read"
        );
    }
    for name in &named {
        assert!(
            env.contains(name),
            "the endpoint file names {name}; the Deployment must set it"
        );
        let from_secret = format!(
            "- name: {name}\n              valueFrom:\n                secretKeyRef:\n                  name: envworker-secrets\n                  key: {name}\n"
        );
        assert!(
            deployment.contains(&from_secret),
            "{name} comes from the envworker-secrets Secret"
        );
    }

    // Port: what the container listens on is what the probes and Service use.
    let listen = deployment_value(&deployment, "ENVWORKER_LISTEN");
    assert!(listen.ends_with(":8080"), "{listen}");
    assert!(deployment.contains("containerPort: 8080"));
    assert!(deployment.contains("path: /healthz") && deployment.contains("path: /readyz"));

    // The stop grace outlasts both teardown bounds, and Kubernetes waits longer still.
    let bound = secs(&deployment_value(
        &deployment,
        "ENVWORKER_MEMORY_TEARDOWN_BOUND",
    ));
    let grace = secs(&deployment_value(&deployment, "ENVWORKER_STOP_GRACE"));
    assert!(grace >= 2 * bound + Duration::from_secs(10), "{grace:?}");
    let kill_after: u64 = yaml_scalar(&deployment, "terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    assert!(
        Duration::from_secs(kill_after) >= grace + Duration::from_secs(10),
        "terminationGracePeriodSeconds {kill_after} must exceed the stop grace {grace:?}"
    );
}

/// `Environment: Variables:` of the SAM template: name → value text.
fn sam_variables(template: &str) -> BTreeMap<String, String> {
    let mut lines = template.lines();
    let header = lines
        .find(|l| l.trim() == "Variables:")
        .expect("the function sets Variables");
    let indent = header.len() - header.trim_start().len();
    lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
        .filter(|l| !l.trim().is_empty() && !l.trim().starts_with('#'))
        .map(|l| {
            let (k, v) = l.trim().split_once(':').expect("NAME: value");
            (k.to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn the_sam_template_sets_only_variables_envworker_reads() {
    let template = read("template.yaml");
    let cli = serve_env_names();
    let vars = sam_variables(&template);
    for name in vars.keys() {
        assert!(
            cli.contains(name) || NOT_FLAGS.contains(&name.as_str()),
            "the SAM template sets {name}, which envworker serve does not read"
        );
    }
    // The default endpoint needs these three; the keys come from Secrets Manager.
    for name in [
        "ANTHROPIC_ENVIRONMENT_ID",
        "ANTHROPIC_ENVIRONMENT_KEY",
        "ANTHROPIC_WEBHOOK_SIGNING_KEY",
    ] {
        assert!(vars.contains_key(name), "the SAM template must set {name}");
    }
    for name in ["ANTHROPIC_ENVIRONMENT_KEY", "ANTHROPIC_WEBHOOK_SIGNING_KEY"] {
        assert!(
            vars[name].contains("{{resolve:secretsmanager:"),
            "{name} must be a Secrets Manager reference, not {}",
            vars[name]
        );
    }
    // Only /tmp is writable on Lambda.
    assert!(vars["ENVWORKER_WORKDIR"].starts_with("/tmp/"));
    assert_eq!(yaml_scalar(&template, "Timeout"), "900");
    assert_eq!(yaml_scalar(&template, "Handler"), "bootstrap");
    assert_eq!(yaml_scalar(&template, "Runtime"), "provided.al2023");
    assert_eq!(yaml_scalar(&template, "BuildMethod"), "rust-cargolambda");
}

#[test]
fn the_container_image_matches_the_command_line() {
    let dockerfile = read("Dockerfile");
    let cli = serve_env_names();
    // ENV names (the continuation lines of ENV too).
    let mut in_env = false;
    let mut names = Vec::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        let body = if let Some(rest) = trimmed.strip_prefix("ENV ") {
            rest
        } else if in_env {
            trimmed
        } else {
            continue;
        };
        in_env = body.ends_with('\\');
        if let Some((name, _)) = body.split_once('=') {
            names.push(name.trim().to_string());
        }
    }
    assert!(!names.is_empty(), "the image sets ENVWORKER_* variables");
    for name in &names {
        assert!(
            cli.contains(name) || NOT_FLAGS.contains(&name.as_str()),
            "the image sets {name}, which envworker serve does not read"
        );
    }

    // The port it exposes is the one serve listens on.
    let default_listen = serve_default("listen");
    let port = default_listen.rsplit(':').next().unwrap();
    assert!(
        dockerfile.contains(&format!("EXPOSE {port}\n")),
        "EXPOSE {port}"
    );
    assert!(dockerfile.contains(&format!("ENVWORKER_LISTEN=0.0.0.0:{port}")));
    assert!(dockerfile.contains(r#"CMD ["serve"]"#));
    assert!(dockerfile.contains("STOPSIGNAL SIGTERM"));

    // The documented docker stop timeout outlasts the default stop grace,
    // which outlasts both default teardown bounds.
    let grace = secs(&serve_default("stop-grace"));
    let bound = secs(&serve_default("memory-teardown-bound"));
    assert!(grace >= 2 * bound + Duration::from_secs(10), "{grace:?}");
    let stop_timeout: u64 = dockerfile
        .split("--stop-timeout ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the Dockerfile documents docker run --stop-timeout");
    assert!(Duration::from_secs(stop_timeout) > grace);
}
