//! Errors of kubelet requests, and their one mapping to gRPC status codes.

/// Why a kubelet request (Allocate, GetPreferredAllocation) was refused. Every variant names the
/// resource and the ids involved so the kubelet's event says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A container request listed no devices.
    #[error("{resource}: container request {container} lists no device ids")]
    NoDevices {
        /// The resource served.
        resource: String,
        /// Position of the container request.
        container: usize,
    },
    /// Ids this plugin does not advertise.
    #[error("{resource}: unknown device ids {ids:?}: they are not advertised by this plugin")]
    UnknownDevices {
        /// The resource served.
        resource: String,
        /// The unknown ids, in request order.
        ids: Vec<String>,
    },
    /// The same id twice in one container request.
    #[error("{resource}: device ids {ids:?} are listed more than once in one container request")]
    DuplicateDevices {
        /// The resource served.
        resource: String,
        /// The repeated ids.
        ids: Vec<String>,
    },
    /// `failRequestsGreaterThanOne` and a container asked for several replicas.
    #[error(
        "{resource}: a container asked for {requested} shared devices; {sharing}.failRequestsGreaterThanOne \
         allows 1 per container"
    )]
    TooManyReplicas {
        /// The resource served.
        resource: String,
        /// The config section that shares it: `sharing.timeSlicing` or `sharing.mps`.
        sharing: &'static str,
        /// How many were asked for.
        requested: usize,
    },
    /// GetPreferredAllocation with a size below 1 or above what is available.
    #[error("{resource}: cannot pick {size} devices from {available} available")]
    BadSize {
        /// The resource served.
        resource: String,
        /// The allocation size asked for.
        size: i64,
        /// How many ids were offered.
        available: usize,
    },
    /// Must-include ids that are not among the available ones, or more of them than the size.
    #[error("{resource}: must-include ids {ids:?} {reason}")]
    BadMustInclude {
        /// The resource served.
        resource: String,
        /// The offending ids.
        ids: Vec<String>,
        /// What is wrong with them.
        reason: String,
    },
}

impl From<RequestError> for tonic::Status {
    fn from(e: RequestError) -> Self {
        // Every refusal is about the request's content; the kubelet does not retry those.
        match e {
            RequestError::NoDevices { .. }
            | RequestError::UnknownDevices { .. }
            | RequestError::DuplicateDevices { .. }
            | RequestError::TooManyReplicas { .. }
            | RequestError::BadSize { .. }
            | RequestError::BadMustInclude { .. } => tonic::Status::invalid_argument(e.to_string()),
        }
    }
}
