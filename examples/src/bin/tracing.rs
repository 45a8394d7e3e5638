//! Tracing across the queue: a request's span enqueues a job, and the handler's span — in
//! whichever process runs it — continues the same trace. Spans go to stdout through
//! OpenTelemetry's stdout exporter. Against the throwaway PostgreSQL:
//! ```sh
//! DATABASE_URL=$(cargo xtask pg url) cargo run -p workpump-examples --bin tracing
//! ```
//! It prints the trace id at the enqueue and in the handler (the same one), then every span.

use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use workpump_host::{handler_fn, Host, HostConfig, Job, JobArgs, JobResult};

#[derive(Serialize, Deserialize)]
struct Thumbnail {
    image: String,
}

impl JobArgs for Thumbnail {
    const KIND: &'static str = "thumbnail";
    const QUEUE: &'static str = "images";
}

/// The trace the current span belongs to.
fn trace_id() -> String {
    tracing::Span::current()
        .context()
        .span()
        .span_context()
        .trace_id()
        .to_string()
}

async fn thumbnail(job: Job<Thumbnail>) -> JobResult {
    // Runs inside the `workpump.job` span, a child of the span that enqueued the job.
    println!("handled  {} in trace {}", job.payload().image, trace_id());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tracing-example")))
        .init();

    let (done_tx, mut done) = tokio::sync::mpsc::channel::<()>(1);
    let host = Host::builder()
        .config(HostConfig::load(None)?)
        .database_url(std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?)
        .job(handler_fn(move |job: Job<Thumbnail>| {
            let done = done_tx.clone();
            async move {
                let result = thumbnail(job).await;
                let _ = done.send(()).await;
                result
            }
        }))
        .start()
        .await?;

    // The request: its span is the trace's root, and the enqueue inside it records the
    // trace context in the item's metadata.
    let request = tracing::info_span!("POST /images");
    async {
        println!("enqueued cat.png in trace {}", trace_id());
        host.enqueue(Thumbnail {
            image: "cat.png".into(),
        })
        .await
    }
    .instrument(request)
    .await?;

    tokio::time::timeout(Duration::from_secs(30), done.recv())
        .await
        .map_err(|_| "the job did not run within 30 s")?;
    host.shutdown();
    host.stopped().await?;
    provider.shutdown()?;
    Ok(())
}
