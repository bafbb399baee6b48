//! The official Python SDK (`anthropic==2.10.0`) drives the devserver's
//! memory stores API, run as a separate process exactly as users start it.

use crate::common::process::DevserverProcess;
use crate::common::sdk;

#[test]
fn the_official_python_sdk_drives_the_memory_stores_api() {
    let server = DevserverProcess::start("sdk-admin-key", &[]);
    let out = sdk::run_script(
        "memory_stores.py",
        &[
            ("ENVWORKER_URL", &server.url),
            ("ENVWORKER_ADMIN_KEY", "sdk-admin-key"),
        ],
    );
    assert!(out.contains("SDK checks passed"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
}
