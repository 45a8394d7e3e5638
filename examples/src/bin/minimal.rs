//! The smallest embed: one handler, one enqueue, run until Ctrl-C (which drains). Against
//! the throwaway PostgreSQL (`cargo xtask pg start` starts it and prints its URL):
//! ```sh
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin minimal
//! ```

use serde::Deserialize;
use workpump_host::{handler_fn, Host, HostConfig, Job, JobError, JobResult, NewWork};

#[derive(Deserialize)]
struct Email {
    to: String,
}

async fn send(job: Job<Email>) -> JobResult {
    if job.payload().to.is_empty() {
        return Err(JobError::dead_letter("no recipient")); // no retry: a dead letter
    }
    println!(
        "sending to {} (attempt {})",
        job.payload().to,
        job.attempt()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host = Host::builder()
        .config(HostConfig::load(None)?) // defaults, then WORKPUMP_* environment
        .database_url(std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?)
        .handler("emails", handler_fn(send))
        .start()
        .await?;
    let email = serde_json::json!({ "to": "ada@example.com" });
    host.enqueue(vec![NewWork::new("emails", email)]).await?;
    host.run_until_signal().await?; // Ctrl-C or SIGTERM: drain, then return
    Ok(())
}
