//! envworker: a self-hosted environment worker for Claude Managed Agents.
//!
//! Module map, by layer: each module uses only modules listed before it
//! (`crate::` paths outside tests), so the list draws the architecture and
//! has no import cycle; `scripts/check_layers.py` checks both in CI, and
//! that no modules below, at any level, use each other in a circle.
//!
//! Foundations, knowing nothing else in the crate:
//!
//! - [`duration`] — human durations (`90`, `90s`, `1m30s`): parsed, bounded,
//!   shown back.
//! - [`fsx`] — opening beneath a directory fd without following symlinks
//!   (`openat2`, or a per-component `O_NOFOLLOW` walk), removal by fd.
//! - [`fdlimit`] — the descriptor limit: raised at start, restored for the agent.
//! - [`sandbox`] — the agent's shell confined: one Landlock domain per
//!   session and, where the kernel allows, a private mount namespace.
//! - [`killpoint`] — named points where a crash test may SIGKILL the
//!   process (debug builds only; a no-op in release).
//! - [`remap`] — advertised mount paths that really live elsewhere (Lambda).
//! - [`cleanroom`] — a session's private workdir and process tree (a
//!   subreaper supervisor), both removed at teardown; init duty as PID 1.
//! - [`webhook`] — Standard Webhooks signing and verification.
//! - [`tls`] — the one place HTTP clients are built: the system's roots,
//!   the proxy variables.
//! - [`telemetry`] — OpenTelemetry traces over OTLP (the `OTEL_*`
//!   variables), off without an endpoint; W3C trace context in, flush out.
//! - [`logging`] — tracing setup, text or JSON lines (and the traces' layer).
//! - [`api`] — typed client for the API subset a worker uses: memory stores,
//!   the work queue, sessions and their events, skills; auth and beta headers,
//!   cursor pagination, error classes.
//!
//! What a session runs on:
//!
//! - [`tools`] — the agent toolset (`bash`, `read`, `write`, `edit`, `glob`,
//!   `grep`) with its path policy, and the spare shell supervisor.
//! - [`skills`] — session set-up, not an agent tool: the agent's skills
//!   downloaded into `<workdir>/skills/<name>/` (hostile archives screened)
//!   and removed at the end.
//! - [`memory`] — memory stores on disk, a sync pass as its data flow:
//!   observe (the confined folder, its watch, the remote index and feed) →
//!   plan (pure, three-way) → execute (uploads, deletes, pulls) → commit
//!   (state and journal); mount, recovery, flush, the push, dispose; the
//!   memory options and their bounds.
//! - [`session`] — the session tool runner: event stream and history,
//!   dispatch one call at a time, the permission gate, results, idle end.
//! - [`config`] — the bounds of the numeric options, and the endpoint file of
//!   `serve` with the table of its keys.
//!
//! The worker, and what watches it:
//!
//! - [`worker`] — the environment worker: lease heartbeat, one item from
//!   claim to force-stop, the poll loop and the webhook's queue drain; it
//!   emits events to observers it knows only as a trait.
//! - [`metrics`] — Prometheus counters: a worker observer, plus the webhook
//!   outcomes, served at `/metrics`.
//!
//! The edges:
//!
//! - [`serve`] — the webhook server: per-endpoint routes, health,
//!   container and Lambda modes, graceful shutdown.
//! - `devserver` — a local control plane answering as the real API does,
//!   over SQLite, so workers can be run and tested without the real API
//!   (the default-on `devserver` cargo feature; production builds may leave
//!   it, and SQLite, out).
//! - [`cli`] — the command line: subcommands and flags (each flag also reads
//!   its `ENVWORKER_*` / `ANTHROPIC_*` variable), and the configuration
//!   reference generated from them, the endpoint file's keys and the bounds.
//! - [`commands`] — the subcommands (`dev`, `serve`, `poll`, `run`,
//!   `devserver`, `webhook sign`, `completions`, `man`), `anyhow` at the edge.

pub mod api;
pub mod cleanroom;
pub mod cli;
pub mod commands;
pub mod config;
#[cfg(feature = "devserver")]
pub mod devserver;
pub mod duration;
pub mod fdlimit;
pub mod fsx;
pub mod killpoint;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod remap;
pub mod sandbox;
pub mod serve;
pub mod session;
pub mod skills;
pub mod telemetry;
pub mod tls;
pub mod tools;
pub mod webhook;
pub mod worker;
