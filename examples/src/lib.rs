//! Examples that embed the workpump host, and `workpump-worker`, the process that
//! `cargo xtask demo`, `cargo xtask bench` and `cargo xtask chaos` start several of.
//!
//! Each binary's header says how to run it against the throwaway PostgreSQL
//! (`cargo xtask pg start`, then `DATABASE_URL=$(cargo xtask pg url) cargo run -p
//! workpump-examples --bin NAME`):
//!
//! - `minimal`: one job kind and its handler, one enqueue, run until Ctrl-C (the README's
//!   quick start);
//! - `tracing`: the trace of a request continued by the handler of the job it enqueued,
//!   exported to stdout through OpenTelemetry;
//! - `axum-service`: an axum service that enqueues in its request transaction and serves
//!   `/health` and `/metrics`;
//! - `checkpoint`: a long job in units that each fit a lease, resumed from its checkpoint
//!   after a restart;
//! - `workpump-worker`: the payload-driven worker process.
//!
//! The tests in `tests/` start `workpump-worker` processes and kill or stop them.

/// The repository's README, whose Rust code blocks rustdoc compiles as this crate's doctests:
/// its quick start cannot fall behind the API. They live here, in a crate that is never
/// published, because a published crate cannot include a file outside its own directory.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
