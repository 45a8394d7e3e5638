//! The README's quick start is the host crate's own example (`src/lib.rs`), which rustdoc
//! compiles: when one changes, this fails until the other follows.

/// The first fenced block after `marker` in `text`, without the fences.
fn block_after<'t>(text: &'t str, marker: &str, fence: &str) -> &'t str {
    let from = text.find(marker).expect("the marker") + marker.len();
    let open = from + text[from..].find(fence).expect("an opening fence") + fence.len();
    let body = open + text[open..].find('\n').expect("a line break") + 1;
    let close = body + text[body..].find("```").expect("a closing fence");
    &text[body..close]
}

#[test]
fn the_readme_quick_start_is_the_crate_docs_quick_start() {
    let readme = include_str!("../../../README.md");
    let lib = include_str!("../src/lib.rs");
    let docs: String = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.trim_start_matches("//!"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let from_docs = block_after(&docs, "", "```no_run");
    let from_readme = block_after(readme, "## Quick start", "```rust");
    assert_eq!(
        from_readme, from_docs,
        "README.md's quick start differs from crates/host/src/lib.rs's example"
    );
}
