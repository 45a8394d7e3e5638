//! `sqlx::migrate!` embeds `sql/migrations` at compile time, but cargo does not know the
//! macro read that directory: without this, a new or edited migration would not reach the
//! build until some Rust file of this crate changed.
//!
//! `sql` in this crate is a symbolic link to the workspace's `sql/` (the one home of the SQL);
//! `cargo package` follows it, so the published crate carries the files themselves.

fn main() {
    println!("cargo:rerun-if-changed=sql/migrations");
}
