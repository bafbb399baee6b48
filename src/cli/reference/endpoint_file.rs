//! The endpoint file's section: an example and a table, both written from
//! [`crate::config::FILE_KEYS`], and the rules the file is held to.

use crate::config::{FILE_KEYS, FileKey, FileTable};

use super::markdown::table;

pub(super) fn section(out: &mut String) {
    out.push_str(
        "One `[[endpoint]]` per route `POST /webhooks/<name>`, given to `envworker serve` with \
         `--config`. Secrets are never written in the file: it names the environment variables \
         that hold them, so the file can be committed and templated \
         (`infra/envworker.example.toml` is a complete example).\n\n",
    );
    out.push_str("```toml\n");
    out.push_str(&example());
    out.push_str("```\n\n");
    let rows: Vec<Vec<String>> = FILE_KEYS
        .iter()
        .map(|k| {
            vec![
                match k.table {
                    FileTable::Top => format!("`{}` (top level)", k.key),
                    FileTable::Endpoint => format!("`{}`", k.key),
                },
                k.kind.to_string(),
                k.default.unwrap_or("— (required)").to_string(),
                k.meaning.to_string(),
            ]
        })
        .collect();
    table(out, &["key", "type", "default", "meaning"], &rows);
    out.push_str(
        "\nUnknown keys, a missing variable, a key that is not `whsec_…` or a duplicate endpoint \
         name stop the server at start with a message naming the key. The variables named by \
         `*_env` are also kept out of the agent's shell.\n",
    );
}

/// Every key with its example value, the endpoint's keys under one
/// `[[endpoint]]`, each commented with whether it is required.
fn example() -> String {
    let line = |k: &FileKey| format!("{} = {}", k.key, k.example);
    let width = FILE_KEYS
        .iter()
        .map(|k| line(k).chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (i, k) in FILE_KEYS.iter().enumerate() {
        if k.table == FileTable::Endpoint
            && FILE_KEYS[..i].iter().all(|p| p.table == FileTable::Top)
        {
            out.push_str("\n[[endpoint]]\n");
        }
        let comment = match k.default {
            None => "required".to_string(),
            Some(default) => format!("optional; default {}", default.replace('`', "")),
        };
        let text = line(k);
        let pad = width - text.chars().count();
        out.push_str(&format!("{text}{}  # {comment}\n", " ".repeat(pad)));
    }
    out
}
