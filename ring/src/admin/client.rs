//! A client for the Admin API that takes several endpoints, like `etcdctl --endpoints`: it uses
//! the first that answers and moves on to the next when one is down.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use super::{ACTOR_HEADER, MAX_ADMIN_MESSAGE_BYTES, RETRY_SAFE_HEADER, is_connection_failure};
use crate::pb::admin_client::AdminClient as Grpc;
use crate::tls::Security;
use crate::tls::client::{Expect, connect};

/// Why an Admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No endpoints were given.
    #[error("no admin endpoint given (use --endpoint host:port)")]
    NoEndpoints,
    /// An endpoint is not a valid address.
    #[error("invalid endpoint {endpoint:?}: {why}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        why: String,
    },
    /// No endpoint could be reached.
    #[error("no member answered: {}", .tried.iter().map(|(e, why)| format!("{e}: {why}")).collect::<Vec<_>>().join("; "))]
    Unreachable {
        /// Each endpoint tried and what went wrong.
        tried: Vec<(String, String)>,
    },
    /// A member answered with an error.
    #[error("{}: {}", code_words(.0.code()), .0.message())]
    Status(Status),
}

impl ClientError {
    /// The gRPC code, when a member answered.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}

fn code_words(code: Code) -> &'static str {
    match code {
        Code::InvalidArgument => "invalid argument",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::FailedPrecondition => "refused",
        Code::ResourceExhausted => "limit reached",
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "timed out",
        Code::PermissionDenied => "permission denied",
        Code::Unauthenticated => "unauthenticated",
        _ => "error",
    }
}

/// How long [`AdminClient::call`] keeps retrying requests the ring says are safe to retry.
pub const RETRY_BUDGET: Duration = Duration::from_secs(10);

/// An Admin API client over one or more endpoints.
pub struct AdminClient {
    endpoints: Vec<String>,
    security: Security,
    actor: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Index of the endpoint that answered last, tried first next time.
    preferred: Mutex<usize>,
}

impl AdminClient {
    /// A client for `endpoints` (`host:port`) using `security`. Without TLS it claims to be
    /// `actor`; with TLS the ring takes the actor from the client certificate.
    pub fn new(
        endpoints: Vec<String>,
        security: Security,
        actor: impl Into<String>,
    ) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        for e in &endpoints {
            Endpoint::from_shared(format!("http://{}", address(e))).map_err(|err| {
                ClientError::BadEndpoint {
                    endpoint: e.clone(),
                    why: err.to_string(),
                }
            })?;
        }
        Ok(Self {
            endpoints,
            security,
            actor: actor.into(),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(60),
            preferred: Mutex::new(0),
        })
    }

    /// Sets how long a whole request may take.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The endpoints, in order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Calls `f` with a client for the first endpoint that can be reached (see
    /// [`AdminClient::call_once`]). When a member answers that the request was certainly not
    /// applied and may be retried (no leader yet, leadership moving), it is sent again with
    /// backoff, for at most [`RETRY_BUDGET`].
    pub async fn call<T, F, Fut, M>(&self, message: M, mut f: F) -> Result<T, ClientError>
    where
        M: Clone,
        F: FnMut(Grpc<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = std::time::Instant::now() + RETRY_BUDGET;
        let mut pause = Duration::from_millis(50);
        loop {
            match self.call_once(message.clone(), &mut f).await {
                Err(ClientError::Status(s))
                    if s.metadata().contains_key(RETRY_SAFE_HEADER)
                        && std::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// Calls `f` once per endpoint until one answers. An endpoint that refuses the connection
    /// or answers `UNAVAILABLE` before doing anything is skipped; any other answer (success or
    /// error) is returned.
    pub async fn call_once<T, F, Fut, M>(&self, message: M, f: &mut F) -> Result<T, ClientError>
    where
        M: Clone,
        F: FnMut(Grpc<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let start = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        let mut tried = Vec::new();
        for offset in 0..self.endpoints.len() {
            let i = (start + offset) % self.endpoints.len();
            let endpoint = &self.endpoints[i];
            let channel = match connect(
                address(endpoint),
                &self.security,
                Expect::AnyMember,
                self.connect_timeout,
                |e| e.timeout(self.request_timeout),
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    tried.push((endpoint.clone(), describe_transport(&e)));
                    continue;
                }
            };
            let client = Grpc::new(channel)
                .max_decoding_message_size(MAX_ADMIN_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_ADMIN_MESSAGE_BYTES);
            let mut request = Request::new(message.clone());
            if let Ok(v) = MetadataValue::try_from(self.actor.as_str()) {
                request.metadata_mut().insert(ACTOR_HEADER, v);
            }
            match f(client, request).await {
                Ok(resp) => {
                    *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = i;
                    return Ok(resp.into_inner());
                }
                Err(status) if is_connection_failure(&status) => {
                    tried.push((endpoint.clone(), status.message().to_string()));
                }
                Err(status)
                    if matches!(self.security, Security::Insecure)
                        && (std::error::Error::source(&status).is_some()
                            || matches!(status.code(), Code::Unknown | Code::Cancelled)) =>
                {
                    // A TLS server dropping a plain-text client: the connection breaks before
                    // any gRPC status.
                    tried.push((
                        endpoint.clone(),
                        format!(
                            "{} (the member probably requires TLS: use a client config or certificate flags instead of --insecure)",
                            status.message()
                        ),
                    ));
                }
                Err(status) => return Err(ClientError::Status(status)),
            }
        }
        Err(ClientError::Unreachable { tried })
    }
}

/// `host:port` of an endpoint given as `host:port` or `http(s)://host:port`.
fn address(endpoint: &str) -> &str {
    endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .unwrap_or(endpoint)
}

fn describe_transport(e: &tonic::transport::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = s.to_string();
        source = s.source();
    }
    text
}
