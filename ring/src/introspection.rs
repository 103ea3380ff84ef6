//! The standard gRPC services next to the ring's own: health checking
//! (`grpc.health.v1.Health`) on the Admin and peer ports, and server reflection
//! (`grpc.reflection.v1.ServerReflection` and `grpc.reflection.v1alpha.ServerReflection`) on the
//! Admin port, so `grpcurl`, `grpc_health_probe` and other generic clients work.
//!
//! Both sit behind the interceptor of the port they are on, like the ring's own service: on the
//! Admin port any `admin` or `viewer` certificate of the ring's CA ([`admit_operators`]; both
//! services only read, so a viewer is enough), on the peer port member certificates only. A
//! client without a certificate is refused, as it is by the Admin service.
//!
//! Health statuses ([`report_health`]):
//!
//! | service name | status |
//! | --- | --- |
//! | `""` (the server) | `SERVING` while the member runs, `NOT_SERVING` once it shuts down |
//! | `gardenring.v1.Admin` | `SERVING` while the member is ready (as `/readyz`: a leader is known and its own lease vouches for its state), `NOT_SERVING` otherwise |
//! | `gardenring.v1.Raft` | `SERVING` while the member runs |
//!
//! A member that is not ready still answers Admin reads (from its applied state); the status
//! says whether that state is current, which is what a load balancer or an operator's probe
//! wants to know.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::auth::admit_operators;
use crate::agent::OwnLease;
use crate::raft::RaftNode;

/// The Admin API's encoded `FileDescriptorSet` (admin.proto), written by `build.rs`.
pub const ADMIN_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/admin_descriptor.bin"));

/// The Admin service's name, as health checks and reflection know it.
pub const ADMIN_SERVICE: &str = crate::pb::admin_server::SERVICE_NAME;
/// The peer service's name.
pub const RAFT_SERVICE: &str = crate::pb::raft_server::SERVICE_NAME;

/// How often the Admin service's health status is brought up to date.
pub const HEALTH_POLL: Duration = Duration::from_millis(100);

/// An interceptor function, as the servers of this crate use them.
pub type Check = fn(Request<()>) -> Result<Request<()>, Status>;

/// Why the reflection service cannot be built (the embedded descriptors do not decode: a build
/// problem, never a runtime one).
#[derive(Debug, thiserror::Error)]
#[error("gRPC reflection: {0}")]
pub struct ReflectionError(#[from] tonic_reflection::server::Error);

fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ADMIN_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The `grpc.reflection.v1` service for the Admin port, behind the Admin interceptor. It lists
/// `gardenring.v1.Admin`, `grpc.health.v1.Health` and itself.
pub fn reflection_v1() -> Result<
    InterceptedService<
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        Check,
    >,
    ReflectionError,
> {
    Ok(InterceptedService::new(
        reflection().build_v1()?,
        admit_operators as Check,
    ))
}

/// The `grpc.reflection.v1alpha` service (older `grpcurl` and grpcio's reflection client ask
/// this one), behind the Admin interceptor.
pub fn reflection_v1alpha() -> Result<
    InterceptedService<
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
        Check,
    >,
    ReflectionError,
> {
    Ok(InterceptedService::new(
        reflection().build_v1alpha()?,
        admit_operators as Check,
    ))
}

/// Keeps the health statuses (see the module documentation) up to date until `stopped`, then
/// reports every service `NOT_SERVING`.
pub async fn report_health(
    reporter: HealthReporter,
    raft: RaftNode,
    own: Arc<OwnLease>,
    disk: crate::raft::disk::DiskHealth,
    mut stopped: watch::Receiver<bool>,
) {
    reporter
        .set_service_status(RAFT_SERVICE, ServingStatus::Serving)
        .await;
    let mut last = None;
    loop {
        let status = match crate::metrics::ready(&raft, &own, &disk) {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if last != Some(status) {
            tracing::debug!(%status, "gRPC health of {ADMIN_SERVICE}");
            reporter.set_service_status(ADMIN_SERVICE, status).await;
            last = Some(status);
        }
        tokio::select! {
            _ = tokio::time::sleep(HEALTH_POLL) => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
    }
    for service in ["", ADMIN_SERVICE, RAFT_SERVICE] {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_descriptor_describes_the_admin_service() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(ADMIN_DESCRIPTOR_SET).unwrap();
        let services: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| {
                f.service
                    .iter()
                    .map(move |s| format!("{}.{}", f.package(), s.name()))
            })
            .collect();
        assert_eq!(services, [ADMIN_SERVICE]);
        assert_eq!(ADMIN_SERVICE, "gardenring.v1.Admin");
        assert!(reflection_v1().is_ok() && reflection_v1alpha().is_ok());
    }
}
