//! `kind = "train"` jobs: the trainer's sections of a job spec (`[model]`, `[data]`,
//! `[train]`, `[checkpoint]`), checked when a job is admitted and written to each rank's spec
//! file. Each rank is this node's own binary run as `ringleader train-worker` (see
//! `jobs::launch`), which calls `trainer::worker::run`; rank 0 prints `ringleader-metric`
//! lines that become job metrics and writes checkpoints under `jobs/<job-id>/ckpt/<step>/` in
//! the node's store.

use ringleader_spec::{FieldError, TrainSpec};
use toml::de::DeTable;

use crate::spec::JobSpec;

/// Sections of a job spec the trainer reads.
const SECTIONS: [&str; 4] = ["model", "data", "train", "checkpoint"];

/// The trainer's view of a job spec: its `[model]`, `[data]`, `[train]` and `[checkpoint]`
/// tables as TOML text (what the worker's spec file holds).
pub fn spec_text(spec: &JobSpec) -> String {
    let mut t = toml::Table::new();
    for (name, section) in
        SECTIONS
            .iter()
            .zip([&spec.model, &spec.data, &spec.train, &spec.checkpoint])
    {
        if let Some(s) = section {
            t.insert((*name).to_string(), toml::Value::Table(s.clone()));
        }
    }
    toml::to_string(&t).unwrap_or_default()
}

/// Reads a train job's trainer sections as the trainer does
/// ([`TrainSpec::from_document`]: unknown keys and bad values refused, the error naming the
/// field): the one reader of these tables, for a job's spec, a search's template and each
/// trial it could make. [`JobSpec::parse`] reads a train job's the same way, over the text
/// the user wrote (so its errors carry lines); this reads tables that came without text.
pub fn read(spec: &JobSpec) -> Result<TrainSpec, FieldError> {
    let text = spec_text(spec);
    // `toml` wrote the text from tables: it parses.
    let doc = DeTable::parse(&text).map_err(|e| FieldError::new("spec", e.message().trim()))?;
    TrainSpec::from_document(doc.get_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> JobSpec {
        JobSpec::parse(text).unwrap()
    }

    /// A command job's spec with `tables` (not checked by the parse as a train job's are).
    fn tables(tables: &str) -> JobSpec {
        let mut spec = JobSpec::parse(&format!(
            "name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\n{tables}"
        ))
        .unwrap();
        spec.kind = crate::spec::JobKind::Train;
        spec.command.clear();
        spec.tables_changed();
        spec
    }

    #[test]
    fn example_spec_reads_and_is_kept_typed() {
        let text = include_str!("../../../../examples/jobs/digits-mlp.toml");
        let spec = read(&parse(text)).unwrap();
        assert_eq!(spec.model.arch, ringleader_spec::Arch::Mlp);
        assert_eq!(parse(text).trainer(), Some(&spec));
    }

    #[test]
    fn bad_fields_are_named() {
        let e = read(&tables("[train]\nlrr = 0.1\n")).unwrap_err();
        assert!(e.to_string().starts_with("train.lrr: unknown field"), "{e}");
        assert!(e.unknown && e.problem.contains("lr, lr_scaling"), "{e}");
        let e = read(&tables("[train]\noptimizer = \"sgdd\"\n")).unwrap_err();
        assert_eq!(e.field, "train.optimizer", "{e}");
        assert!(!e.unknown);
        let e = read(&tables("[model]\nhidden = [0]\n")).unwrap_err();
        assert_eq!(e.field, "model.hidden", "{e}");
        assert!(read(&tables("[train]\nmax_steps = 5\n")).is_ok());
    }
}
