//! The rank's environment: the name of every `RINGLEADER_*` variable a node sets for a rank
//! it starts (and the one a job's `env` may set), so the node writes them, the trainer reads
//! them and the Python package (through `ringleader._native`, as `<NAME>_ENV`) reads them
//! with one spelling. docs/book/src/reference/protocol.md and the book's Jobs page say what each
//! carries; the values are part of the protocol and never change within a
//! [`crate::PROTOCOL_VERSION`].
//!
//! [`ALL`] lists every name with its constant's name, for the Python extension and for tests.
//! The node's own settings (`RINGLEADER_PEER`, `RINGLEADER_TOKEN`, …), the test hooks
//! (`RINGLEADER_TEST_*`) and the knobs of `ringleader.torch` set by whoever starts the ranks
//! (`RINGLEADER_DATA_HOST`, …) are not the node↔rank contract and are not here.

/// What every name here starts with; a job's `env` may set none of them but [`NO_SHM`] (and,
/// outside this module, `ringleader.torch`'s `RINGLEADER_CUDA_BACKEND`).
pub const PREFIX: &str = "RINGLEADER_";

macro_rules! names {
    ($($(#[doc = $doc:literal])+ $name:ident = $value:literal;)+) => {
        $($(#[doc = $doc])+ pub const $name: &str = $value;)+

        /// Every name of this module: (the constant's name, the variable's name).
        pub const ALL: &[(&str, &str)] = &[$((stringify!($name), $name)),+];
    };
}

names! {
    /// The protocol's version the node speaks ([`crate::PROTOCOL_VERSION`]); every rank.
    PROTOCOL_VERSION = "RINGLEADER_PROTOCOL_VERSION";
    /// The job's id; every rank.
    JOB_ID = "RINGLEADER_JOB_ID";
    /// The job's attempt (a retry from the last checkpoint is a new one); every rank.
    ATTEMPT = "RINGLEADER_ATTEMPT";
    /// The ring's generation when the rank started (a re-form makes a new one); every rank.
    GENERATION = "RINGLEADER_GENERATION";
    /// A trial's search (the search job's id); a search trial's ranks only.
    SEARCH_ID = "RINGLEADER_SEARCH_ID";
    /// A trial's number within its search; a search trial's ranks only.
    TRIAL_ID = "RINGLEADER_TRIAL_ID";
    /// `1` for a speculative copy of a trial, else `0`; a search trial's ranks only.
    TRIAL_COPY = "RINGLEADER_TRIAL_COPY";
    /// The resource a trial's run must reach (its rung's target, in the search's unit:
    /// epochs); set when the chief gave the run one.
    TRIAL_RESOURCE = "RINGLEADER_TRIAL_RESOURCE";
    /// `1` for a run of a `resumable = true` search's command trial: the run ends at its rung
    /// ([`TRIAL_RESOURCE`]), and a promotion resumes the trial in a new run.
    TRIAL_RESUMABLE = "RINGLEADER_TRIAL_RESUMABLE";
    /// A trial's parameters as one JSON object, names as the search spec writes them.
    PARAMS = "RINGLEADER_PARAMS";
    /// Each trial parameter alone: this prefix, then its name in upper case with every
    /// character that is not a letter or digit made `_` (`lr` → `RINGLEADER_PARAM_LR`).
    PARAM_PREFIX = "RINGLEADER_PARAM_";
    /// How a command rank lives through a re-form (`[elastic] protocol`): `ringleader` (its
    /// process is kept, its generations arrive on stdin) or `torchrun` (every rank is started
    /// again); command ranks only.
    ELASTIC_PROTOCOL = "RINGLEADER_ELASTIC_PROTOCOL";
    /// `1` for a standby joiner of a ringleader-protocol command job: it is started ahead of
    /// the re-form that takes it in, gets no generation until then, and prints
    /// `ringleader-ready` once set up.
    STANDBY = "RINGLEADER_STANDBY";
    /// The absolute path of the job's shared dataset, fetched by the rank's node before it
    /// starts; ranks of a job with a shared dataset only.
    DATASET_DIR = "RINGLEADER_DATASET_DIR";
    /// The ring's secret for the collective's handshake (never shown by the API); train
    /// ranks only.
    SECRET = "RINGLEADER_SECRET";
    /// The checkpoint storage URL (may carry keys, hence not on the command line); train
    /// ranks only.
    STORAGE = "RINGLEADER_STORAGE";
    /// The number of GPUs the rank was given (0: none); every rank (a command rank's
    /// `CUDA_VISIBLE_DEVICES` may list its host-mates' too: this is its own count).
    GPUS = "RINGLEADER_GPUS";
    /// The node's checkpoint endpoint on loopback, for a command rank's
    /// `ringleader.checkpoint`.
    CHECKPOINT_URL = "RINGLEADER_CHECKPOINT_URL";
    /// The capability that endpoint wants (`Authorization: Bearer`), scoped to the job.
    CHECKPOINT_TOKEN = "RINGLEADER_CHECKPOINT_TOKEN";
    /// The SHA-256 pin of the endpoint's TLS key, when the node's API is on TLS.
    CHECKPOINT_TLS_SHA256 = "RINGLEADER_CHECKPOINT_TLS_SHA256";
    /// `true` in a job's `env` keeps a train rank's ring links on TCP (no shared memory
    /// between ranks of one host); the one name of this module a job may set.
    NO_SHM = "RINGLEADER_NO_SHM";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name is the prefix and its constant's name (a `_PREFIX` constant's without
    /// that word; the Python names follow from the constants'), and no two are the same.
    #[test]
    fn names_are_the_prefix_and_the_constant() {
        let mut seen = std::collections::BTreeSet::new();
        for (constant, name) in ALL {
            let stem = constant.strip_suffix("PREFIX").unwrap_or(constant);
            assert_eq!(*name, format!("{PREFIX}{stem}"), "{constant}");
            assert!(seen.insert(*name), "{name} twice");
        }
    }
}
