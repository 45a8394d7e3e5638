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

/// `enqueue_work` holds two copies of its INSERT, one with `ON CONFLICT` for batches with
/// unique keys and one without (a batch without unique keys then writes no speculative
/// insertion: docs/performance.md, "Enqueue"). They must stay the same statement otherwise:
/// a check or a column changed in one copy only would hold for half the batches.
#[test]
fn enqueue_works_two_inserts_differ_only_in_on_conflict() {
    let text = migrations()
        .into_iter()
        .find(|(name, _)| name.ends_with("_enqueue_work.sql"))
        .expect("the enqueue_work migration")
        .1;
    let body = text
        .split("CREATE FUNCTION enqueue_work(")
        .nth(1)
        .expect("enqueue_work's definition")
        .split("\n$$;")
        .next()
        .expect("its body");
    // Each copy: from `WITH ins AS (` to the `)` that closes it, whitespace folded.
    let copies: Vec<String> = body
        .split("WITH ins AS (")
        .skip(1)
        .map(|rest| {
            let end = rest
                .find("RETURNING id, queue, state")
                .expect("the copy's RETURNING");
            rest[..end].split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect();
    assert_eq!(copies.len(), 2, "enqueue_work's INSERT copies: {copies:#?}");
    let conflict = "ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL AND state IN \
                    ('available', 'scheduled', 'running', 'blocked') DO NOTHING";
    let (with, without): (Vec<&String>, Vec<&String>) =
        copies.iter().partition(|c| c.contains("ON CONFLICT"));
    assert_eq!(
        (with.len(), without.len()),
        (1, 1),
        "one copy with ON CONFLICT, one without: {copies:#?}"
    );
    assert!(
        with[0].ends_with(conflict),
        "the copy with ON CONFLICT ends with it: {}",
        with[0]
    );
    assert_eq!(
        with[0].trim_end_matches(conflict).trim_end(),
        without[0].as_str(),
        "the two copies of enqueue_work's INSERT differ in more than ON CONFLICT"
    );
}
