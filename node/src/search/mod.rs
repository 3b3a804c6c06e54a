//! Hyperparameter searches: `kind = "search"` jobs whose trials run across the cluster.
//!
//! - [`spec`]: the search spec, checked at submit (a search that could never run is
//!   refused), and each trial's job spec made from the template and its params.
//! - [`record`]: the search's replicated record (every trial, where it runs, its reports)
//!   and a trial job's link to its search.
//! - [`summary`]: the search's document (trials, best), shown by the API and written to
//!   storage as `experiments/<job-id>/summary.json` when the search ends.
//!
//! The algorithms are the trainer's ([`trainer::search`], pure). A trial runs as a job of
//! its own (placed like any job, its logs and checkpoints under its id); the control state
//! applies the search's commands (`domain::state::trials`: a trial started, reported, promoted,
//! copied, finished), deciding continue / pause / promote / stop on each report with the
//! searcher, so every replica agrees; the chief decides what to start next
//! (`chief::search`). A new chief carries on from the log alone.
//!
//! - [`writer`]: each node writes ended searches' summaries to its storage.
//!
//! May use: `domain::spec`, `domain::train_spec`, `domain::id`; `summary` reads a `Job`
//! record and `writer` the control handle (neither is used by `control`). Used by:
//! `control`, `chief`, `api`, the node's start-up.

pub mod summary;
pub mod writer;
