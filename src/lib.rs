//! envworker: a self-hosted environment worker for Claude Managed Agents.
//!
//! Module map:
//!
//! - [`api`] — typed client for the API subset a worker uses: memory stores,
//!   the work queue, sessions and their events, skills; auth and beta headers,
//!   cursor pagination, error classes.
//! - [`devserver`] — a local control plane answering as the real API does,
//!   over SQLite, so workers can be run and tested without the real API.
//! - [`fsx`] — opening beneath a directory fd without following symlinks
//!   (`openat2`, or a per-component `O_NOFOLLOW` walk), removal by fd.
//! - [`memory`] — memory stores on disk: the confined folder, the pure
//!   three-way planner, the sync executor, deletes, flush, dispose.
//! - [`metrics`] — Prometheus counters fed from the worker's events and
//!   the webhook outcomes, served at `/metrics`.
//! - [`remap`] — advertised mount paths that really live elsewhere (Lambda).
//! - [`serve`] — the webhook server: per-endpoint routes, health,
//!   container and Lambda modes, graceful shutdown.
//! - [`session`] — the session tool runner: event stream and history,
//!   dispatch one call at a time, the permission gate, results, idle end.
//! - [`tools`] — the agent toolset (`bash`, `read`, `write`, `edit`, `glob`,
//!   `grep`) with its path policy, and the agent's skills.
//! - [`webhook`] — Standard Webhooks signing and verification.
//! - [`worker`] — the environment worker: lease heartbeat, one item from
//!   claim to force-stop, the poll loop and the webhook's queue drain.
//! - [`config`] — configuration helpers shared by every mode (durations).
//! - [`commands`] — the subcommands (`dev`, `serve`, `poll`, `run`,
//!   `devserver`, `webhook sign`), `anyhow` at the edge.
//! - [`cli`] — the command line: subcommands and flags (each flag also reads
//!   its `ENVWORKER_*` / `ANTHROPIC_*` variable).
//! - [`logging`] — tracing setup, text or JSON lines.
//! - [`fdlimit`] — the descriptor limit: raised at start, restored for the agent.

pub mod api;
pub mod cli;
pub mod commands;
pub mod config;
pub mod devserver;
pub mod duration;
pub mod fdlimit;
pub mod fsx;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod remap;
pub mod serve;
pub mod session;
pub mod tools;
pub mod webhook;
pub mod worker;
