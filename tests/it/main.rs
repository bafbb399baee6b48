//! The integration tests, one binary (the layout the Rust community
//! recommends for large suites: the crate and its dependencies linked once,
//! and libtest schedules every area's tests together instead of one binary
//! after another). A module per area; `common` is the shared harness.
//! `cargo test --test it <area>::` runs one area.
//!
//! Two files stay binaries of their own: `tests/release.rs` (built without
//! the devserver feature, the production configuration) and
//! `tests/serve_flood.rs` (it lowers its own process's descriptor limit).

#[path = "../common/mod.rs"]
mod common;

mod api_client;
mod bounds;
mod cargo_lambda;
mod chaos;
mod cleanroom;
mod cli;
mod crash;
mod devserver_memory_api;
mod devserver_sessions;
mod devserver_validation;
mod devserver_work_queue;
mod differential;
mod docs;
mod events;
mod infra;
mod lambda;
mod memory_deletes_and_trust;
mod memory_devserver;
mod memory_faithful;
mod memory_flush_and_lost_responses;
mod memory_hardening;
mod memory_model;
mod memory_recovery;
mod memory_sync;
mod memory_watch;
mod network;
mod otel;
mod resilience;
mod sdk_conformance;
mod sdk_worker;
mod serve_app;
mod serve_process;
mod session_runner;
mod shell_sandbox;
mod skills;
mod spare_supervisor;
mod termination;
mod tool_lane;
mod tools;
mod tools_bounds;
mod tools_confinement;
mod tools_confinement_e2e;
mod tools_symlinks;
mod worker;
