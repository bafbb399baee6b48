//! `envworker webhook sign`: Standard Webhooks headers for a body, and a
//! ready curl line, so sample events never go stale.

use std::io::Read;

use anyhow::Context;

use crate::cli::SignArgs;
use crate::webhook::SigningKey;

/// The three headers for `body`, signed now.
pub fn sign(key: &SigningKey, id: &str, body: &[u8], now: i64) -> [(String, String); 3] {
    [
        ("webhook-id".into(), id.to_string()),
        ("webhook-timestamp".into(), now.to_string()),
        ("webhook-signature".into(), key.sign(id, now, body)),
    ]
}

pub fn run(args: SignArgs) -> anyhow::Result<()> {
    let key = SigningKey::parse(&args.key).context("--key")?;
    let body = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?
    };
    let id = args.id.clone().unwrap_or_else(|| {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("id").and_then(|i| i.as_str()).map(str::to_string))
            .unwrap_or_else(|| format!("msg_{:016x}", rand::random::<u64>()))
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let headers = sign(&key, &id, &body, now);
    for (name, value) in &headers {
        println!("{name}: {value}");
    }
    let file = if args.file.as_os_str() == "-" {
        "body.json".to_string()
    } else {
        args.file.display().to_string()
    };
    let mut curl = format!(
        "curl -sS -X POST {} -H 'content-type: application/json'",
        shell_quote(&args.url)
    );
    for (name, value) in &headers {
        curl.push_str(&format!(" -H {}", shell_quote(&format!("{name}: {value}"))));
    }
    curl.push_str(&format!(" --data-binary @{}", shell_quote(&file)));
    println!("{curl}");
    Ok(())
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
