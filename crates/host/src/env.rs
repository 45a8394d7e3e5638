//! The `WORKPUMP_` environment layer of [`HostConfig`](crate::HostConfig).
//!
//! A variable's name after the prefix is a path of segments joined by `__`:
//! `WORKPUMP_CLAIM__POLL_BASE_MS=100` sets `claim.poll_base_ms`. Section and setting
//! segments are case-insensitive (read in lower case), as are the prefix and figment's own
//! environment provider. One segment is not: the queue name in
//! `WORKPUMP_QUEUES__<name>__<SETTING>` is kept exactly as written, so
//! `WORKPUMP_QUEUES__Emails__CONCURRENCY=4` configures the queue `Emails`.
//!
//! A queue name may hold characters an environment variable's name cannot (`.`, `-`, `:` in
//! a shell, `export`, or a `.env` file). Such a queue is configured under an alias of your
//! choosing, which a `NAME` setting maps to the queue's real name:
//!
//! ```text
//! WORKPUMP_QUEUES__BILLING__NAME=billing.emails-v2
//! WORKPUMP_QUEUES__BILLING__CONCURRENCY=4
//! ```
//!
//! The alias then stands for the name in every variable of that group (its case does not
//! matter once `NAME` is set). Refused, naming the variables: a `NAME` that is empty or not a
//! valid queue name, and two groups that configure the same queue (two aliases naming one
//! queue, or an alias naming a queue that is also configured under its own name).

use std::collections::BTreeMap;

use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};
use workpump_coordinator::validate_queue_name;

/// The prefix of every variable (matched case-insensitively).
pub(crate) const PREFIX: &str = "WORKPUMP_";
/// Between the segments of a variable's name.
const SEPARATOR: &str = "__";
/// The setting that maps an alias to a queue's name.
const NAME: &str = "name";

/// The environment layer: `WORKPUMP_` variables read as described in the module docs.
pub(crate) struct EnvLayer {
    vars: Vec<(String, String)>,
}

impl EnvLayer {
    /// The variables of this process.
    pub(crate) fn from_process() -> Self {
        Self::from_vars(
            std::env::vars_os()
                .map(|(k, v)| (k.to_string_lossy().into_owned(), v.to_string_lossy().into())),
        )
    }

    /// These variables (the ones without the prefix are ignored).
    pub(crate) fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| {
                k.get(..PREFIX.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
            })
            .collect();
        vars.sort();
        EnvLayer { vars }
    }
}

/// One `WORKPUMP_QUEUES__<segment>__...` group.
#[derive(Default)]
struct QueueGroup {
    /// `NAME`'s value and the variable that set it.
    name: Option<(String, String)>,
    /// The settings: (path below the queue, value, variable).
    settings: Vec<(Vec<String>, String, String)>,
}

impl Provider for EnvLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment variable(s)").interpolater(|_: &Profile, path: &[&str]| {
            let segments: Vec<String> = path
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    if i == 1 && path[0] == "queues" {
                        (*s).to_owned()
                    } else {
                        s.to_ascii_uppercase()
                    }
                })
                .collect();
            format!("{PREFIX}{}", segments.join(SEPARATOR))
        })
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        let mut dict = Dict::new();
        let mut queues: BTreeMap<String, QueueGroup> = BTreeMap::new();
        for (var, value) in &self.vars {
            let key = var[PREFIX.len()..].trim();
            let segments: Vec<&str> = key.split(SEPARATOR).collect();
            // As figment's provider: a name with an empty segment is not ours.
            if segments.iter().any(|s| s.is_empty()) {
                continue;
            }
            let section = segments[0].to_ascii_lowercase();
            if section == "queues" && segments.len() >= 3 {
                let group = queues.entry(segments[1].to_owned()).or_default();
                let rest: Vec<String> = segments[2..]
                    .iter()
                    .map(|s| s.to_ascii_lowercase())
                    .collect();
                if rest.len() == 1 && rest[0] == NAME {
                    if let Some((_, earlier)) = &group.name {
                        return Err(Error::from(format!(
                            "{earlier} and {var} both name the queue of the alias {:?}: keep one",
                            segments[1]
                        )));
                    }
                    group.name = Some((value.clone(), var.clone()));
                } else {
                    group.settings.push((rest, value.clone(), var.clone()));
                }
                continue;
            }
            let mut path = vec![section];
            path.extend(segments[1..].iter().map(|s| s.to_ascii_lowercase()));
            insert(&mut dict, &path, parse(value));
        }

        // Resolve the aliases: each queue configured by one group only.
        let mut by_queue: BTreeMap<String, (String, QueueGroup)> = BTreeMap::new();
        for (segment, group) in queues {
            let queue = match &group.name {
                None => segment.clone(),
                Some((name, var)) => {
                    if let Err(e) = validate_queue_name(name) {
                        return Err(Error::from(format!(
                            "{var}={name:?} does not name a queue: {e}. NAME maps the alias \
                             {segment:?} to the queue's name: `{PREFIX}QUEUES__<ALIAS>__NAME=\
                             billing.emails-v2` with `{PREFIX}QUEUES__<ALIAS>__CONCURRENCY=4`"
                        )));
                    }
                    name.clone()
                }
            };
            if group.settings.is_empty() {
                continue;
            }
            let first_var = group.settings[0].2.clone();
            if let Some((other_segment, other)) = by_queue.get(&queue) {
                let other_var = other
                    .name
                    .as_ref()
                    .map_or_else(|| other.settings[0].2.clone(), |(_, v)| v.clone());
                let this_var = group.name.as_ref().map_or(first_var, |(_, v)| v.clone());
                return Err(Error::from(format!(
                    "the queue {queue:?} is configured under two names in the environment, \
                     {other_segment:?} ({other_var}) and {segment:?} ({this_var}): use one"
                )));
            }
            by_queue.insert(queue, (segment, group));
        }
        for (queue, (_, group)) in by_queue {
            for (rest, value, _) in group.settings {
                let mut path = vec!["queues".to_owned(), queue.clone()];
                path.extend(rest);
                insert(&mut dict, &path, parse(&value));
            }
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// A value as figment's environment provider reads it (numbers, booleans, arrays, dicts,
/// else a string).
fn parse(value: &str) -> Value {
    match value.parse::<Value>() {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// Sets `path` in `dict`, making the dicts on the way (a later variable wins).
fn insert(dict: &mut Dict, path: &[String], value: Value) {
    let (last, parents) = path
        .split_last()
        .expect("a variable has at least one segment");
    let mut at = dict;
    for key in parents {
        let entry = at
            .entry(key.clone())
            .or_insert_with(|| Value::from(Dict::new()));
        if entry.as_dict().is_none() {
            *entry = Value::from(Dict::new());
        }
        at = match entry {
            Value::Dict(_, d) => d,
            _ => unreachable!("made a dict above"),
        };
    }
    at.insert(last.clone(), value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use figment::Figment;

    fn layer(vars: &[(&str, &str)]) -> Figment {
        Figment::from(EnvLayer::from_vars(
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        ))
    }

    fn value(figment: &Figment, key: &str) -> Option<Value> {
        figment.find_value(key).ok()
    }

    #[test]
    fn sections_and_settings_are_case_insensitive_and_queue_names_keep_their_case() {
        let f = layer(&[
            ("WORKPUMP_CLAIM__POLL_BASE_MS", "100"),
            ("workpump_Lease__Lease_MS", "30s"),
            ("WORKPUMP_QUEUES__Emails__CONCURRENCY", "4"),
            ("WORKPUMP_QUEUES__emails__Max_Attempts", "3"),
            ("OTHER_QUEUES__X__CONCURRENCY", "1"),
            ("WORKPUMP_CLAIM____POLL", "1"),
        ]);
        assert_eq!(
            value(&f, "claim.poll_base_ms").and_then(|v| v.to_u128()),
            Some(100)
        );
        assert_eq!(
            value(&f, "lease.lease_ms").and_then(|v| v.into_string()),
            Some("30s".to_owned())
        );
        let queues = f.find_value("queues").unwrap().into_dict().unwrap();
        assert_eq!(
            queues.keys().collect::<Vec<_>>(),
            ["Emails", "emails"],
            "two queues, told apart by case"
        );
        assert_eq!(
            queues["Emails"].as_dict().unwrap()["concurrency"].to_u128(),
            Some(4)
        );
        assert_eq!(
            queues["emails"].as_dict().unwrap()["max_attempts"].to_u128(),
            Some(3)
        );
        // A name with an empty segment is skipped, as figment's provider skips it.
        let claim = f.find_value("claim").unwrap().into_dict().unwrap();
        assert_eq!(claim.keys().collect::<Vec<_>>(), ["poll_base_ms"]);
    }

    #[test]
    fn an_alias_with_a_name_configures_a_queue_whose_name_no_variable_can_hold() {
        let f = layer(&[
            ("WORKPUMP_QUEUES__BILLING__NAME", "billing.emails-v2:eu"),
            ("WORKPUMP_QUEUES__BILLING__CONCURRENCY", "4"),
            ("WORKPUMP_QUEUES__BILLING__LEASE_MS", "2m"),
            ("WORKPUMP_QUEUES__UNUSED__NAME", "only.a.name"),
        ]);
        let queues = f.find_value("queues").unwrap().into_dict().unwrap();
        assert_eq!(queues.keys().collect::<Vec<_>>(), ["billing.emails-v2:eu"]);
        let q = queues["billing.emails-v2:eu"].as_dict().unwrap();
        assert_eq!(q["concurrency"].to_u128(), Some(4));
        assert_eq!(q["lease_ms"].as_str(), Some("2m"));
        assert!(!q.contains_key("name"));
        // Aliases keep their case too: `billing` is a queue of its own, no NAME maps it.
        let f = layer(&[
            ("WORKPUMP_QUEUES__BILLING__NAME", "billing.emails-v2"),
            ("WORKPUMP_QUEUES__billing__LEASE_MS", "2m"),
        ]);
        let queues = f.find_value("queues").unwrap().into_dict().unwrap();
        assert_eq!(queues.keys().collect::<Vec<_>>(), ["billing"]);
    }

    #[test]
    fn a_bad_name_or_two_groups_for_one_queue_are_refused_naming_the_variables() {
        let err = |vars: &[(&str, &str)]| {
            layer(vars)
                .find_value("queues")
                .expect_err("refused")
                .to_string()
        };
        let e = err(&[
            ("WORKPUMP_QUEUES__B__NAME", "has space"),
            ("WORKPUMP_QUEUES__B__CONCURRENCY", "1"),
        ]);
        assert!(
            e.contains("WORKPUMP_QUEUES__B__NAME=\"has space\" does not name a queue"),
            "{e}"
        );
        let e = err(&[
            ("WORKPUMP_QUEUES__B__NAME", ""),
            ("WORKPUMP_QUEUES__B__CONCURRENCY", "1"),
        ]);
        assert!(e.contains("does not name a queue"), "{e}");
        let e = err(&[
            ("WORKPUMP_QUEUES__A__NAME", "x.y"),
            ("WORKPUMP_QUEUES__A__CONCURRENCY", "1"),
            ("WORKPUMP_QUEUES__B__NAME", "x.y"),
            ("WORKPUMP_QUEUES__B__MAX_ATTEMPTS", "1"),
        ]);
        assert!(
            e.contains("the queue \"x.y\" is configured under two names")
                && e.contains("WORKPUMP_QUEUES__A__NAME")
                && e.contains("WORKPUMP_QUEUES__B__NAME"),
            "{e}"
        );
        let e = err(&[
            ("WORKPUMP_QUEUES__emails__CONCURRENCY", "1"),
            ("WORKPUMP_QUEUES__MAIL__NAME", "emails"),
            ("WORKPUMP_QUEUES__MAIL__MAX_ATTEMPTS", "1"),
        ]);
        assert!(
            e.contains("\"emails\" is configured under two names"),
            "{e}"
        );
        let e = err(&[
            ("WORKPUMP_QUEUES__A__NAME", "x"),
            ("WORKPUMP_QUEUES__A__name", "y"),
        ]);
        assert!(e.contains("both name the queue of the alias \"A\""), "{e}");
    }
}
