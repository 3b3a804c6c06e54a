//! The control state's dataset registry: which names exist and the content each names.
//!
//! A name is added once, with the root of its manifest and the figures `dataset ls` shows;
//! adding a name that exists is refused (the content of a name never changes under a job
//! that uses it: add a new name instead). Removing a name drops it from the registry; each
//! node then deletes its copy of content no name refers to any more (`datasets::service`).
//! Which members hold a dataset is not here: it changes with every fetch and every death,
//! so it travels in gossip metadata instead (`cluster::meta::HeldDataset`).

use serde::{Deserialize, Serialize};

use super::{rejected, ControlResponse, ControlState};
use crate::content::Root;
use crate::spec::JobSpec;

/// Longest dataset name, in bytes (the trainer's rule for `data.dataset`).
pub const NAME_BYTES_MAX: usize = ringleader_spec::DATASET_NAME_BYTES_MAX;

/// The datasets a train job may name without adding them (the trainer's built-ins).
pub const BUILTIN: [&str; 3] = ringleader_spec::BUILTIN_DATASETS;

/// Checks a dataset name: 1 to 64 letters, digits, `.`, `_`, `-`, starting with a letter or
/// digit, and not a built-in's name. The error says so, naming the value.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let starts_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if !starts_ok || name.len() > NAME_BYTES_MAX || !name.chars().all(ok_char) {
        return Err(format!(
            "dataset name {name:?}: 1 to {NAME_BYTES_MAX} letters, digits, '.', '_' or '-', starting with a letter or digit"
        ));
    }
    if BUILTIN.contains(&name) {
        return Err(format!("dataset name {name:?} is a built-in dataset's"));
    }
    Ok(())
}

/// Most names an unknown dataset's refusal lists ([`ControlState::unknown_dataset`]).
pub const NAMES_LISTED_MAX: usize = 10;

/// Most names in the registry (the registry lives in every snapshot).
pub const DATASETS_MAX: usize = 10_000;

/// One registered dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRecord {
    /// The root of its manifest: what the name stands for.
    pub root: Root,
    /// Total bytes of its files.
    pub size_bytes: u64,
    /// How many files.
    pub files: u64,
    /// How many chunks, all files together.
    pub chunks: u64,
    /// When it was added, ms since the Unix epoch (the proposer's clock).
    pub added_at_ms: u64,
    /// The member (name) it was added on: its first holder.
    pub added_on: String,
    /// The user who added it (see `domain::state::users`); a dataset of a log from before
    /// owners, the admin.
    #[serde(
        default = "super::users::admin_user",
        skip_serializing_if = "super::users::is_admin_user"
    )]
    pub owner: String,
}

impl ControlState {
    /// Applies `DatasetAdd`.
    pub(super) fn dataset_add(&mut self, name: &str, record: &DatasetRecord) -> ControlResponse {
        if self.datasets.contains_key(name) {
            return rejected(format!("dataset {name:?} exists"));
        }
        if self.datasets.len() >= DATASETS_MAX {
            return rejected(format!(
                "the registry holds {DATASETS_MAX} datasets already"
            ));
        }
        self.datasets.insert(name.to_owned(), record.clone());
        ControlResponse::Applied
    }

    /// Applies `DatasetRemove`.
    pub(super) fn dataset_remove(&mut self, name: &str) -> ControlResponse {
        match self.datasets.remove(name) {
            Some(_) => ControlResponse::Applied,
            None => rejected(format!("no dataset {name:?}")),
        }
    }

    /// Why `spec` cannot be admitted against the registry, as (field, problem): its `[data]
    /// dataset` names no dataset of the cluster (nor a built-in). The problem lists the
    /// names there are (at most [`NAMES_LISTED_MAX`]). Admission asks it of the state a
    /// submit is proposed on, wherever the submit arrived (the API, a forwarded one).
    pub fn unknown_dataset(&self, spec: &JobSpec) -> Option<(&'static str, String)> {
        let name = spec.tables().data.as_ref()?.get("dataset")?.as_str()?;
        if BUILTIN.contains(&name) || self.datasets.contains_key(name) {
            return None;
        }
        let mut names: Vec<&str> = self
            .datasets
            .keys()
            .map(String::as_str)
            .take(NAMES_LISTED_MAX)
            .collect();
        let more = self.datasets.len().saturating_sub(NAMES_LISTED_MAX);
        let more_text = format!("{more} more");
        if more > 0 {
            names.push(&more_text);
        }
        let there = match names.is_empty() {
            true => "none yet: add one with `ringleader dataset add`".to_owned(),
            false => names.join(", "),
        };
        Some((
            "data.dataset",
            format!("no dataset {name:?} in the cluster (datasets: {there})"),
        ))
    }

    /// Whether any registered name refers to `root`.
    pub fn dataset_root_named(&self, root: &Root) -> bool {
        self.datasets.values().any(|r| r.root == *root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ops, ControlCommand, Op};

    fn record(byte: u8) -> DatasetRecord {
        DatasetRecord {
            root: Root([byte; 32]),
            size_bytes: 10,
            files: 1,
            chunks: 1,
            added_at_ms: 5,
            added_on: "a".into(),
            owner: "admin".into(),
        }
    }

    fn add(name: &str, byte: u8) -> ControlCommand {
        ControlCommand {
            op: Op::DatasetAdd(ops::DatasetAdd {
                name: name.into(),
                record: record(byte),
            }),
            at_ms: 5,
        }
    }

    #[test]
    fn a_name_is_added_once_and_removed_once() {
        let mut s = ControlState::default();
        assert_eq!(s.apply(1, &add("d", 1)), ControlResponse::Applied);
        assert!(
            matches!(s.apply(2, &add("d", 2)), ControlResponse::Rejected { reason } if reason.contains("exists"))
        );
        assert_eq!(s.datasets["d"].root, Root([1; 32]));
        assert!(s.dataset_root_named(&Root([1; 32])));
        let rm = ControlCommand {
            op: Op::DatasetRemove(ops::DatasetRemove { name: "d".into() }),
            at_ms: 6,
        };
        assert_eq!(s.apply(3, &rm), ControlResponse::Applied);
        assert!(matches!(s.apply(4, &rm), ControlResponse::Rejected { .. }));
        assert!(!s.dataset_root_named(&Root([1; 32])));
    }

    #[test]
    fn a_spec_naming_an_unknown_dataset_is_refused_naming_the_field_and_the_names() {
        let spec = |data: &str| {
            JobSpec::parse(&format!(
                "name = \"j\"\nkind = \"command\"\ncommand = [\"true\"]\n[data]\ndataset = \"{data}\"\n"
            ))
            .unwrap()
        };
        let mut s = ControlState::default();
        assert_eq!(
            s.unknown_dataset(&spec("foo")),
            Some((
                "data.dataset",
                "no dataset \"foo\" in the cluster (datasets: none yet: add one with `ringleader dataset add`)".into()
            ))
        );
        s.apply(1, &add("b", 1));
        s.apply(2, &add("a", 2));
        assert_eq!(
            s.unknown_dataset(&spec("foo")).unwrap().1,
            "no dataset \"foo\" in the cluster (datasets: a, b)"
        );
        assert_eq!(s.unknown_dataset(&spec("a")), None);
        assert_eq!(s.unknown_dataset(&spec(BUILTIN[0])), None);
        for i in 0..NAMES_LISTED_MAX {
            s.apply(3 + i as u64, &add(&format!("n{i:02}"), 3 + i as u8));
        }
        assert!(s
            .unknown_dataset(&spec("foo"))
            .unwrap()
            .1
            .ends_with(", 2 more)"));
    }

    #[test]
    fn a_bad_name_never_reaches_the_registry() {
        let mut s = ControlState::default();
        for bad in ["", "a/b", "digits", "../x", &"x".repeat(65)] {
            assert!(
                matches!(
                    s.apply(1 + s.applied_index, &add(bad, 1)),
                    ControlResponse::Rejected { .. }
                ),
                "{bad:?}"
            );
        }
        assert!(s.datasets.is_empty());
    }
}
