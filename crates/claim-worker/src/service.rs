//! Handlers as tower services: the erased form every handler is stored as
//! ([`AttemptService`]), a [`Handler`] turned into a service ([`HandlerService`]) and any
//! service turned into a handler ([`service_handler`]), so tower layers wrap handlers per kind
//! and, through [`Handlers::layer`](crate::Handlers::layer), all of them.

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Future};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use crate::handler::{decode_payload, Handler, Job, JobError, JobResult};

/// The error type of a handler's service: what middleware fails with (tower's `Timeout`
/// answers `Elapsed` as one). Any such error fails the attempt, retried with the queue's
/// backoff, its message naming the error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The form every handler of every queue and kind is stored and called as: a service from
/// one attempt with its payload as JSON to the handler's result. The payload is decoded into
/// the handler's type inside it; a payload that does not decode answers
/// `Ok(Err(JobError::dead_letter(..)))` with the serde error.
/// [`Handlers::layer`](crate::Handlers::layer) takes layers over it.
pub type AttemptService = BoxCloneSyncService<Job<Value>, JobResult, BoxError>;

/// A layer over every handler, erased ([`Handlers::layer`](crate::Handlers::layer)).
pub(crate) type LayerFn = Arc<dyn Fn(AttemptService) -> AttemptService + Send + Sync>;

/// Erases a layer whose service fits in an [`AttemptService`].
pub(crate) fn layer_fn<L>(layer: L) -> LayerFn
where
    L: Layer<AttemptService> + Send + Sync + 'static,
    L::Service: Service<Job<Value>, Response = JobResult> + Clone + Send + Sync + 'static,
    <L::Service as Service<Job<Value>>>::Error: Into<BoxError>,
    <L::Service as Service<Job<Value>>>::Future: Send + 'static,
{
    Arc::new(move |inner| {
        BoxCloneSyncService::new(layer.layer(inner).map_err(Into::<BoxError>::into))
    })
}

/// `handler` as an [`AttemptService`]: decodes the payload, then calls it.
pub(crate) fn erase<H: Handler>(handler: H) -> AttemptService {
    let handler = Arc::new(handler);
    BoxCloneSyncService::new(tower::service_fn(move |job: Job<Value>| {
        let handler = handler.clone();
        async move {
            let (payload, job) = job.take_payload();
            Ok::<_, BoxError>(match decode_payload::<H::Payload>(payload) {
                Ok(payload) => handler.handle(job.with_payload(payload)).await,
                Err(error) => Err(JobError::dead_letter(error)),
            })
        }
    }))
}

/// A service that answers every attempt with `result(job)`: the stand-in for a kind this
/// instance has no handler for, so layers see those attempts too.
pub(crate) fn answer(
    result: impl Fn(&Job<Value>) -> JobResult + Send + Sync + 'static,
) -> AttemptService {
    let result = Arc::new(result);
    BoxCloneSyncService::new(tower::service_fn(move |job: Job<Value>| {
        ready(Ok::<_, BoxError>(result(&job)))
    }))
}

/// The attempt failed in the handler's service (a middleware's error): a retried failure.
pub(crate) fn service_error(e: BoxError) -> JobError {
    let mut message = format!("the handler's service failed: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    JobError::retry(message)
}

/// A [`Handler`] as a tower service ([`Handler::into_service`]), so layers can wrap it:
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use workpump_claim_worker::{handler_fn, service_handler, Handler, Job};
///
/// let send = handler_fn(|job: Job<serde_json::Value>| async move { Ok(()) });
/// let handler = service_handler(
///     ServiceBuilder::new()
///         .timeout(Duration::from_secs(30))
///         .service(send.into_service()),
/// );
/// # let _ = handler;
/// ```
pub struct HandlerService<H>(Arc<H>);

impl<H> HandlerService<H> {
    pub(crate) fn new(handler: H) -> Self {
        HandlerService(Arc::new(handler))
    }
}

impl<H> Clone for HandlerService<H> {
    fn clone(&self) -> Self {
        HandlerService(self.0.clone())
    }
}

impl<H> fmt::Debug for HandlerService<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HandlerService")
    }
}

impl<H: Handler> Service<Job<H::Payload>> for HandlerService<H> {
    type Response = JobResult;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<JobResult, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, job: Job<H::Payload>) -> Self::Future {
        let handler = self.0.clone();
        Box::pin(async move { Ok(handler.handle(job).await) })
    }
}

/// Any tower service from a [`Job<T>`] to a [`JobResult`] as a [`Handler`] of `T`, to register
/// with [`Handlers::add`](crate::Handlers::add) or [`Handlers::add_job`](crate::Handlers::add_job)
/// (or the host's `handler` and `job`). Per attempt it waits for the service to be ready
/// (`poll_ready`) and calls a clone of it, both inside the attempt's lease guard: waiting
/// counts toward `max_duration` and is interrupted by lease loss. An error of the service
/// (`Elapsed` from a timeout layer, say) is a failed attempt, retried with the queue's
/// backoff, its message naming the error; a layer that wants a dead letter answers
/// `Ok(Err(JobError::dead_letter(..)))`.
pub fn service_handler<T, S>(service: S) -> ServiceHandler<S, T>
where
    T: DeserializeOwned + Send + 'static,
    S: Service<Job<T>, Response = JobResult> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    ServiceHandler {
        service,
        _payload: PhantomData,
    }
}

/// See [`service_handler`].
pub struct ServiceHandler<S, T> {
    service: S,
    _payload: PhantomData<fn() -> T>,
}

#[async_trait]
impl<S, T> Handler for ServiceHandler<S, T>
where
    T: DeserializeOwned + Send + 'static,
    S: Service<Job<T>, Response = JobResult> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Payload = T;

    async fn handle(&self, job: Job<T>) -> JobResult {
        let mut service = self.service.clone();
        let ready = service.ready().await.map_err(|e| service_error(e.into()))?;
        ready.call(job).await.map_err(|e| service_error(e.into()))?
    }
}
