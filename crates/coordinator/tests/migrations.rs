//! The shape of `sql/migrations` before the first release (docs/store.md, "Changing a
//! function"): files numbered 0001, 0002, ... without gaps, and every function created once,
//! in one file, with no `CREATE OR REPLACE`, so that the file a function is in is its whole
//! current definition. After the first release a change becomes a new file that replaces a
//! function; this test then changes with that rule.

use std::collections::BTreeMap;

fn migrations() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/migrations");
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("sql/migrations")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .map(|p| {
            let name = p
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).expect("a migration");
            (name, text)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn migrations_are_numbered_from_one_without_gaps() {
    let files = migrations();
    assert!(files.len() >= 20, "{} migrations", files.len());
    for (i, (name, _)) in files.iter().enumerate() {
        let number = format!("{:04}_", i + 1);
        assert!(
            name.starts_with(&number)
                && name.ends_with(".sql")
                && name[5..name.len() - 4]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_'),
            "migration {} is {name}, expected {number}<concern>.sql",
            i + 1
        );
    }
}

#[test]
fn every_function_is_created_once_and_never_replaced() {
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    for (file, text) in migrations() {
        for line in text.lines() {
            let upper = line.to_ascii_uppercase();
            assert!(
                !upper.contains("CREATE OR REPLACE")
                    && !upper.starts_with("ALTER FUNCTION")
                    && !upper.starts_with("DROP FUNCTION"),
                "{file}: `{line}` changes a function after its creation; before the first \
                 release, edit the file that creates it"
            );
            if let Some(rest) = line.strip_prefix("CREATE FUNCTION ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(!name.is_empty(), "{file}: `{line}`");
                if let Some(first) = defined.insert(name.clone(), file.clone()) {
                    panic!("{name} is created in {first} and again in {file}");
                }
            }
        }
    }
    for function in [
        "claim_work",
        "renew_leases",
        "record_heartbeat",
        "cleanup_stale_instances",
        "enqueue_work",
        "server_status",
    ] {
        assert!(
            defined.contains_key(function),
            "{function} is never created"
        );
    }
}
