//! `cargo xtask pg start|stop|url|status [--bench]`: the throwaway PostgreSQL by hand.

use std::process::ExitCode;

use workpump_testdb::Cluster;

use crate::{usage_error, Outcome};

pub(crate) fn run(args: &[String]) -> Outcome {
    let mut action = None;
    let mut bench = false;
    for arg in args {
        match arg.as_str() {
            "--bench" => bench = true,
            "start" | "stop" | "url" | "status" if action.is_none() => action = Some(arg.as_str()),
            other => return Ok(usage_error(&format!("unexpected `pg` argument `{other}`"))),
        }
    }
    let Some(action) = action else {
        return Ok(usage_error("`pg` needs one of start, stop, url, status"));
    };
    let cluster = if bench {
        Cluster::bench()?
    } else {
        Cluster::test()?
    };

    match action {
        "start" => {
            cluster.start()?;
            println!("{}", cluster.url("postgres"));
            if std::env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty()) {
                eprintln!("note: DATABASE_URL is set, so tests use that server, not this one");
            }
        }
        "stop" => {
            cluster.stop()?;
            eprintln!("cluster {:?} stopped", cluster.name());
        }
        "url" => {
            if !cluster.is_running() {
                eprintln!(
                    "cluster {:?} is not running; start it with `cargo xtask pg start{}`",
                    cluster.name(),
                    if bench { " --bench" } else { "" }
                );
                return Ok(ExitCode::FAILURE);
            }
            println!("{}", cluster.url("postgres"));
        }
        _ => status(&cluster),
    }
    Ok(ExitCode::SUCCESS)
}

fn status(cluster: &Cluster) {
    let state = if cluster.is_running() {
        "running"
    } else if cluster.is_initialised() {
        "stopped"
    } else {
        "not initialised; `start` creates it"
    };
    println!("cluster:  {}", cluster.name());
    println!("state:    {state}");
    println!("data dir: {}", cluster.data_dir().display());
    println!("log:      {}", cluster.log_file().display());
    println!("binaries: {}", cluster.bin_dir().display());
    if cluster.port() != 0 {
        println!("url:      {}", cluster.url("postgres"));
        println!("tcp url:  {}", cluster.tcp_url("postgres"));
    }
}
