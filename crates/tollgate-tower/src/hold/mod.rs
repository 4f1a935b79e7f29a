//! The service and response future shared by the layers that hold something
//! while the inner service runs: [`LockLayer`](crate::LockLayer) (a lease on
//! one resource) and the concurrency limit (one of N permits). A lock is the
//! N = 1 case, so the acquire → call → release machinery exists once.

mod future;
pub(crate) mod gate;
mod layer;
mod service;

pub use self::future::ResponseFuture;
pub(crate) use self::gate::Gate;
pub use self::layer::{HoldKind, HoldLayer};
pub use self::service::Hold;
pub(crate) use self::service::{head_of, Shared};
