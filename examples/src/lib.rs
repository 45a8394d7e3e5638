//! Examples that embed the workpump host, and `workpump-worker`, the process that
//! `cargo xtask demo`, `cargo xtask bench` and `cargo xtask chaos` start several of.
