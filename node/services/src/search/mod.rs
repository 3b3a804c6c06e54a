//! Hyperparameter searches: `kind = "search"` jobs whose trials run across the cluster.
//!
//! A search's spec, each trial's job spec, its replicated record and leaderboard are the
//! domain's (`domain::search`), and so is applying its commands (`domain::state::trials`:
//! a trial started, reported, promoted, copied, finished, deciding continue / pause /
//! promote / stop on each report with the searcher, so every replica agrees); the chief
//! decides what to start next (`chief::search`). A new chief carries on from the log alone.
//! The algorithms are the trainer's ([`trainer::search`], pure). This part is the node's
//! side that outlives the cluster:
//!
//! - [`summary`]: the search's document (trials, best), shown by the API and written to
//!   storage as `experiments/<job-id>/summary.json` when the search ends.
//! - [`writer`]: ended searches' summaries to storage (once between members sharing a store).
//!
//! May use: `domain`, `control` (the handle, for `writer`), `jobs::archive`. Used by: the
//! node's start-up.

pub mod summary;
pub mod writer;
