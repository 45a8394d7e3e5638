//! The smallest embed: one job kind and its handler, one enqueue, run until Ctrl-C (which drains). Against
//! the throwaway PostgreSQL (`cargo xtask pg start` starts it and prints its URL):
//! ```sh
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin minimal
//! ```

use serde::{Deserialize, Serialize};
use workpump_host::{handler_fn, Host, HostConfig, Job, JobArgs, JobError, JobResult};

/// The job's arguments: the kind names it in the store, the queue is where it runs.
#[derive(Serialize, Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
    const QUEUE: &'static str = "emails";
}

async fn send(job: Job<SendEmail>) -> JobResult {
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
        .job(handler_fn(send))
        .start()
        .await?;
    host.enqueue(SendEmail {
        to: "ada@example.com".into(),
    })
    .await?;
    host.run_until_signal().await?; // Ctrl-C or SIGTERM: drain, then return
    Ok(())
}
