//! Jobs: what users submit, and how this node runs its share of them.
//!
//! - [`admit`] and [`admit_text`] are the one gate every spec passes to enter the log, from
//!   the API or forwarded by another node ([`admit_forwarded`], handed to the control RPC
//!   server at start). The spec itself is the domain's (`domain::spec`, `domain::train_spec`).
//! - [`launch`]: a rank's ports, environment, command line and files (pure).
//! - [`supervisor`]: the per-node reconcile, a pure [`supervisor::plan`] carried out by the
//!   [`supervisor::Supervisor`]; [`process`] runs one rank's process (its log kept where
//!   `control::logs` reads it); [`log_rate`] caps the bytes a rank adds to its log per second.
//! - [`groups`]: running ranks' process groups on disk, killed at the next start after a
//!   kill -9 of the node.
//! - [`archive`]: every ended job's record written to the store (what outlives compaction).
//! - [`checkpoint`]: a command rank's checkpoint place and its capability (pure).
//! - [`interfaces`]: the interface of the node's data-plane address, ranks'
//!   `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME`.
//!
//! May use: `domain` (specs, the replicated job records), `control` (the handle to propose
//! reports, rank logs), `security` (`run_as`: ranks run as `--run-as USER`; sealed secrets),
//! `datasets` (a rank's dataset), `cluster` (member hosts), `gpus` (a rank's
//! `CUDA_VISIBLE_DEVICES`).
//! Placement and retries are the chief's (`crate::chief`).

pub mod archive;
pub mod checkpoint;
pub mod groups;
pub mod interfaces;
pub mod launch;
pub mod log_rate;
pub mod process;
pub mod supervisor;

pub use crate::domain::spec::{JobKind, JobSpec, Placement, Resources, SpecError};

/// Parses and checks a spec's text as the API admits it: [`JobSpec::parse`] (sizes, fields,
/// lines, a train job's trainer tables), then a search's `[search]` and every trial it
/// could make. The error names the field and, where it is in the text, its line.
pub fn admit_text(text: &str) -> Result<JobSpec, String> {
    admit_spec_text(text).map_err(|e| e.to_string())
}

/// Why [`admit_spec_text`] refused a spec: the message users read, and the field and line
/// it is about where known (the API answers them as JSON next to the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AdmitError {
    /// The whole message, field and line included.
    pub message: String,
    /// The dotted field path, if the error is about one.
    pub field: Option<String>,
    /// The 1-based line in the spec's text, if known.
    pub line: Option<usize>,
}

impl From<SpecError> for AdmitError {
    fn from(e: SpecError) -> Self {
        AdmitError {
            message: e.to_string(),
            field: e.field().map(str::to_owned),
            line: e.line(),
        }
    }
}

/// [`admit_text`] with the error typed: the same gate, the same messages.
pub fn admit_spec_text(text: &str) -> Result<JobSpec, AdmitError> {
    admit_document(text).map_err(AdmitError::from)
}

/// The gate: the text is parsed once ([`spec::Document`]); a train job's trainer tables
/// are read in that parse and kept typed on the spec ([`JobSpec::trainer`]); a search's
/// problem gets its field's line from the same document.
fn admit_document(text: &str) -> Result<JobSpec, SpecError> {
    let doc = crate::domain::spec::Document::parse(text)?;
    let spec = doc.job_spec()?;
    if spec.kind == JobKind::Search {
        crate::domain::search::spec::validate(&spec).map_err(|e| doc.field_error(e))?;
    }
    Ok(spec)
}

/// [`admit_spec_text`] for a spec given as JSON (an object with the TOML's keys): written
/// as TOML ([`JobSpec::toml_of_json`]) and admitted through the same gate, so errors name
/// the same fields. A JSON syntax error names its line and column; past that, lines in the
/// TOML would point into text the user never wrote, so errors carry the field only.
pub fn admit_spec_json(json: &str) -> Result<JobSpec, AdmitError> {
    let text = JobSpec::toml_of_json(json)?;
    admit_document(&text).map_err(|e| AdmitError {
        message: e.message_without_line(),
        field: e.field().map(str::to_owned),
        line: None,
    })
}

/// Checks a spec that arrived already parsed (a submit forwarded by another node) through
/// exactly the same gate: it is written back to TOML, admitted as text, and must come back
/// unchanged.
pub fn admit(spec: &JobSpec) -> Result<(), String> {
    let again = admit_text(&spec.to_toml())?;
    if again != *spec {
        return Err("spec changes when parsed again; refused".into());
    }
    Ok(())
}

/// The admission of a submit another node forwarded to the chief (the RPC server's
/// `control::rpc::Admission`): its `[secrets]` entered sealed by the API node that took the
/// submit, and the spec passes [`admit`].
pub fn admit_forwarded(spec: &JobSpec) -> Result<(), String> {
    if let Some(name) = spec
        .secrets
        .iter()
        .find(|(_, v)| !crate::security::sealed::is_sealed(v))
        .map(|(k, _)| k)
    {
        return Err(format!(
            "secrets.{name}: not sealed (a submit goes through a node's API, which seals them)"
        ));
    }
    admit(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_specs_survive_a_forward() {
        for text in [
            include_str!("../../../examples/jobs/digits-mlp.toml"),
            include_str!("../../../examples/jobs/hello-command.toml"),
            include_str!("../../../examples/jobs/torch-ddp.toml"),
            include_str!("../../../examples/jobs/digits-asha.toml"),
            include_str!("../../../examples/jobs/random-command.toml"),
        ] {
            let spec = admit_text(text).unwrap();
            admit(&spec).unwrap();
        }
    }

    #[test]
    fn a_bad_search_is_refused_at_submit_with_its_field_and_line() {
        let text = "name = \"s\"\nkind = \"search\"\ncommand = [\"true\"]\n[search]\ntrial = \"command\"\nalgorithm = \"random\"\ntrials = 3\nmetric = \"m\"\ndirection = \"max\"\n[[search.params]]\nname = \"lr\"\ntype = \"double\"\nmin = 1.0\nmax = 0.5\n";
        let e = admit_text(text).unwrap_err();
        assert!(e.starts_with("search.params[0]."), "{e}");
        assert!(
            e.ends_with("at line 13") || e.ends_with("at line 14"),
            "{e}"
        );
        let e = admit_text(&text.replace("algorithm = \"random\"", "algorithm = \"bayes\""))
            .unwrap_err();
        assert!(e.starts_with("search.algorithm: "), "{e}");
        assert!(e.ends_with("at line 6"), "{e}");
        let e = admit_text(&text.replace("metric = \"m\"\n", "")).unwrap_err();
        assert!(e.starts_with("search.metric: "), "{e}");
        // A search of train trials whose parameter is no key of the trial spec.
        let text = "name = \"s\"\nkind = \"search\"\n[train]\nepochs = 2\n[search]\nalgorithm = \"random\"\ntrials = 3\nmetric = \"val_accuracy\"\ndirection = \"max\"\n[[search.params]]\nname = \"train.lrr\"\ntype = \"double\"\nmin = 0.1\nmax = 0.5\n";
        let e = admit_text(text).unwrap_err();
        assert!(
            e.contains("train.lrr") && e.contains("unknown field"),
            "{e}"
        );
        assert!(e.ends_with("at line 10"), "{e}");
        let spec = admit_text(&text.replace("train.lrr", "train.lr")).unwrap();
        admit(&spec).unwrap();
    }

    #[test]
    fn a_json_spec_passes_the_same_gate_and_its_errors_name_fields_without_toml_lines() {
        let spec = admit_spec_json(
            r#"{"name": "j", "kind": "command", "command": ["true"], "workers": 2}"#,
        )
        .unwrap();
        admit(&spec).unwrap();
        let e = admit_spec_json(
            r#"{"name": "j", "kind": "command", "command": ["true"], "workers": 0}"#,
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("workers"));
        assert_eq!(e.line, None);
        assert_eq!(e.message, "workers: expected a positive integer");
        let e = admit_spec_json(
            r#"{"name": "j", "kind": "command", "command": ["true"], "wokers": 2}"#,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "unknown field \"wokers\" (did you mean \"workers\"?)"
        );
        // A search's error, found past the parse, names its field too.
        let e = admit_spec_json(
            r#"{"name": "s", "kind": "search", "command": ["true"], "search": {"trial": "command",
               "algorithm": "bayes", "trials": 3, "metric": "m", "direction": "max",
               "params": [{"name": "lr", "type": "double", "min": 0.1, "max": 0.5}]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("search.algorithm"), "{e}");
        assert!(!e.message.contains("at line"), "{e}");
        // JSON syntax: its own line and column.
        let e = admit_spec_json("{\n\"name\": 'a'}").unwrap_err();
        assert_eq!((e.field, e.line), (None, Some(2)));
        assert!(
            e.message.starts_with("invalid JSON at line 2 column"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_forwarded_spec_meets_the_apis_limits() {
        let text = "name = \"a\"\nkind = \"train\"\nworkers = 2\n[train]\nlr = 0.1\n";
        let spec = admit_text(text).unwrap();
        let mut bad = spec.clone();
        bad.min_workers = 3;
        assert!(admit(&bad).unwrap_err().starts_with("min_workers:"));
        let mut bad = spec.clone();
        bad.name = "no spaces allowed".into();
        assert!(admit(&bad).unwrap_err().starts_with("name:"));
        let mut bad = spec.clone();
        bad.train
            .as_mut()
            .unwrap()
            .insert("lrr".into(), toml::Value::Float(0.1));
        assert!(admit(&bad)
            .unwrap_err()
            .starts_with("train.lrr: unknown field"));
        let mut bad = spec;
        bad.env.insert("RANK".into(), "3".into());
        assert!(admit(&bad).unwrap_err().contains("RANK"));
    }

    #[test]
    fn a_refused_spec_keeps_its_field_and_line_typed() {
        let e = admit_spec_text("name = \"x\"\nkind = \"command\"\nwokers = 1\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("wokers"));
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("did you mean \"workers\""), "{e}");
        let e = admit_spec_text("name = \"t\"\nkind = \"train\"\nworkers = 1\n[train]\nlr = -1\n")
            .unwrap_err();
        assert!(e.message.starts_with("train.lr"), "{e}");
        assert_eq!(e.field.as_deref(), Some("train.lr"), "{e}");
        assert_eq!(e.line, Some(5));
        assert_eq!(e.message, "train.lr: -1 must be positive at line 5");
        // An unknown key of a trainer table: found by the trainer's reader, named with its
        // line and the keys the table knows.
        let e =
            admit_spec_text("name = \"t\"\nkind = \"train\"\n[model]\nhidden = [8]\nhiden = [8]\n")
                .unwrap_err();
        assert_eq!((e.field.as_deref(), e.line), (Some("model.hiden"), Some(5)));
        assert!(
            e.message
                .starts_with("model.hiden: unknown field (known: arch, channels, d_model,"),
            "{e}"
        );
        assert!(e.message.ends_with(" at line 5"), "{e}");
    }

    #[test]
    fn a_train_spec_is_kept_typed_and_read_again_once_from_its_stored_form() {
        let text = "name = \"t\"\nkind = \"train\"\n[train]\nepochs = 3\n";
        let spec = admit_text(text).unwrap();
        assert_eq!(spec.trainer().map(|t| t.train.epochs), Some(3));
        // The stored form is the tables alone; read back, the typed view is read again.
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains("trainer"), "{json}");
        let back: JobSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back.trainer(), spec.trainer());
        assert_eq!(back, spec);
    }
}
