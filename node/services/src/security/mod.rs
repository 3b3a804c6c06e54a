//! The node's own secrets and the files that hold them: what `ringleader node` needs before
//! anything listens.
//!
//! - [`api_token`]: the API tokens a node accepts (kept as hashes) and the token file's
//!   format.
//! - [`bootstrap`]: the cluster key and the API token a node runs with. A node started
//!   without a key and without `--join` makes both at first start (as k3s makes its token);
//!   a joiner needs the key; `--insecure` is the one way to run without them.
//! - [`modes`]: data directories 0700 and files 0600 (the process umask, and an upgrade
//!   pass over a data directory an older node left group- or world-readable), and the checks
//!   that refuse secret files other users may write or read.
//! - [`rank_dir`]: a rank's places set up as root through descriptors that never follow a
//!   link (the user may swap any entry of its own directories for one at any moment).
//! - [`run_as`]: `--run-as USER`, ranks run as an unprivileged user that cannot read the
//!   node's secrets or state.
//! - [`uid_range`]: `--run-as-range LOW-HIGH`, each job's ranks under a uid of their own.
//! - [`tls`]: the API's TLS beyond loopback, its key derived from the cluster key so one
//!   fingerprint (carried by `api.token`) pins every node.
//!
//! What each secret grants is the book's security model (docs/book/src/operations/security.md):
//! the cluster key makes a host a
//! member (a Raft voter, ranks of every job, every job's secrets); the API token is a shell
//! on every node (a command job runs anything, as the node's user).
//!
//! May use: `cluster::identity` (the key's format), `domain::id` (a job's id, for `run_as`).

pub mod api_token;
pub mod bootstrap;
pub mod modes;
pub mod rank_dir;
pub mod run_as;
pub mod sealed;
pub mod tls;
pub mod uid_range;
