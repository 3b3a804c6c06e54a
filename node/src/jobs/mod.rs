//! Jobs: what users submit and where it runs.
//!
//! - [`spec`]: the job spec (TOML) with line-accurate validation errors.
//! - [`placement`]: sans-IO choice of workers for a job, in ring order.
//!
//! Lifecycle, retries and the replicated job records live in `crate::control`.

pub mod placement;
pub mod spec;

pub use placement::{place, Candidate, Request, Slot, Unplaceable};
pub use spec::{JobKind, JobSpec, Placement, Resources, SpecError};
