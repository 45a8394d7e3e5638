//! `sqlx::migrate!` embeds `sql/migrations` at compile time, but cargo does not know the
//! macro read that directory: without this, a new or edited migration would not reach the
//! build until some Rust file of this crate changed.

fn main() {
    println!("cargo:rerun-if-changed=../../sql/migrations");
}
