//! `kind = "train"` jobs: the trainer's sections of a job spec (`[model]`, `[data]`,
//! `[train]`, `[checkpoint]`), checked when a job is admitted and written to each rank's spec
//! file. Each rank is this node's own binary run as `ringleader train-worker` (see
//! `jobs::launch`), which calls `trainer::worker::run`; rank 0 prints `ringleader-metric`
//! lines that become job metrics and writes checkpoints under `jobs/<job-id>/ckpt/<step>/` in
//! the node's store.
//!
//! [`TrainerTables`] holds the sections in a spec: the tables as the user gave them (the form
//! the Raft log stores, byte for byte as before) and their typed reading, a [`TrainSpec`],
//! made whenever the tables are made or changed, so the two cannot disagree.
//!
//! Why the tables stay the stored form rather than the typed value: the log holds the keys
//! the user gave and only those (`"train":{"epochs":9,"lr":0.125}`), integers and floats as
//! written (`lr = 1` is the integer 1). A [`TrainSpec`] has every default filled in and
//! every number in its field's type, so it cannot write those bytes back, and a log entry
//! or snapshot written before would not encode again to the same bytes (the control-format
//! fixture pins them).

use ringleader_spec::{FieldError, TrainSpec};
use serde::{Deserialize, Serialize};
use toml::de::DeTable;

use crate::spec::JobSpec;

/// Sections of a job spec the trainer reads.
const SECTIONS: [&str; 4] = ["model", "data", "train", "checkpoint"];

/// The trainer's sections of a spec as the user gave them, each absent or a table: the
/// stored form (in the log as four keys of the spec, `null` when absent).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Tables {
    /// `[model]`.
    pub model: Option<toml::Table>,
    /// `[data]` (a command job's too: its shared dataset).
    pub data: Option<toml::Table>,
    /// `[train]`.
    pub train: Option<toml::Table>,
    /// `[checkpoint]`.
    pub checkpoint: Option<toml::Table>,
}

impl Tables {
    /// The sections by key, in the spec's order.
    pub fn by_name(&self) -> [(&'static str, &Option<toml::Table>); 4] {
        [
            (SECTIONS[0], &self.model),
            (SECTIONS[1], &self.data),
            (SECTIONS[2], &self.train),
            (SECTIONS[3], &self.checkpoint),
        ]
    }

    /// The section `name` (one of `model`, `data`, `train`, `checkpoint`), to change.
    pub fn by_name_mut(&mut self, name: &str) -> Option<&mut Option<toml::Table>> {
        match name {
            "model" => Some(&mut self.model),
            "data" => Some(&mut self.data),
            "train" => Some(&mut self.train),
            "checkpoint" => Some(&mut self.checkpoint),
            _ => None,
        }
    }

    /// The sections as TOML text (what a train rank's spec file holds).
    pub fn text(&self) -> String {
        let mut t = toml::Table::new();
        for (name, section) in self.by_name() {
            if let Some(s) = section {
                t.insert(name.to_owned(), toml::Value::Table(s.clone()));
            }
        }
        toml::to_string(&t).unwrap_or_default()
    }

    /// The sections read as the trainer reads them ([`TrainSpec::from_document`]: unknown
    /// keys and bad values refused, the error naming the field).
    pub fn read(&self) -> Result<TrainSpec, FieldError> {
        let text = self.text();
        // `toml` wrote the text from tables: it parses.
        let doc = DeTable::parse(&text).map_err(|e| FieldError::new("spec", e.message().trim()))?;
        TrainSpec::from_document(doc.get_ref())
    }
}

/// A spec's trainer sections with their typed reading.
///
/// Invariant: `typed` is `tables.read().ok()`, whatever the spec's kind (a command job's
/// tables and a search's template read too; only a train job's reading is used,
/// [`JobSpec::trainer`]). Held by construction: the fields are private, the tables change
/// only through [`TrainerTables::edit`], and the stored form (serde) is the tables alone,
/// read again when a spec is decoded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TrainerTables {
    tables: Tables,
    typed: Option<TrainSpec>,
}

impl TrainerTables {
    /// `tables` and their reading.
    pub fn new(tables: Tables) -> TrainerTables {
        let typed = tables.read().ok();
        TrainerTables { tables, typed }
    }

    /// `tables` with `typed`, read from the same sections by [`TrainSpec::from_document`]
    /// over the spec's text (the parse of a train job, which reads them for its errors'
    /// lines anyway).
    pub(crate) fn read_as(tables: Tables, typed: TrainSpec) -> TrainerTables {
        TrainerTables {
            tables,
            typed: Some(typed),
        }
    }

    /// The tables as the user gave them.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The tables read by the trainer; `None` when it refuses them (which admission never
    /// lets through for a train job).
    pub fn typed(&self) -> Option<&TrainSpec> {
        self.typed.as_ref()
    }

    /// Changes the tables with `change`, and reads them again.
    pub fn edit<R>(&mut self, change: impl FnOnce(&mut Tables) -> R) -> R {
        let out = change(&mut self.tables);
        self.typed = self.tables.read().ok();
        out
    }
}

/// The stored form: the tables alone, the four keys of the spec they have always been.
impl Serialize for TrainerTables {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.tables.serialize(serializer)
    }
}

/// The stored form read back, and the tables read by the trainer (a spec from the log is
/// not checked again: tables it refuses, from an older version, read as `None`).
impl<'de> Deserialize<'de> for TrainerTables {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Tables::deserialize(deserializer).map(TrainerTables::new)
    }
}

/// The trainer's view of a job spec: its `[model]`, `[data]`, `[train]` and `[checkpoint]`
/// tables as TOML text (what the worker's spec file holds).
pub fn spec_text(spec: &JobSpec) -> String {
    spec.tables().text()
}

/// Reads a train job's trainer sections as the trainer does
/// ([`TrainSpec::from_document`]: unknown keys and bad values refused, the error naming the
/// field): the one reader of these tables, for a job's spec, a search's template and each
/// trial it could make. [`JobSpec::parse`] reads a train job's the same way, over the text
/// the user wrote (so its errors carry lines); this reads tables that came without text.
pub fn read(spec: &JobSpec) -> Result<TrainSpec, FieldError> {
    spec.tables().read()
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
        spec
    }

    #[test]
    fn example_spec_reads_and_is_kept_typed() {
        let text = include_str!("../../../../examples/jobs/digits-mlp.toml");
        let spec = read(&parse(text)).unwrap();
        assert_eq!(spec.model.arch, ringleader_spec::Arch::Mlp);
        assert_eq!(parse(text).trainer(), Some(&spec));
    }

    /// Every example spec, and each with a table the trainer refuses.
    fn specs() -> Vec<JobSpec> {
        let examples = [
            include_str!("../../../../examples/jobs/digits-mlp.toml"),
            include_str!("../../../../examples/jobs/digits-asha.toml"),
            include_str!("../../../../examples/jobs/hello-command.toml"),
            include_str!("../../../../examples/jobs/random-command.toml"),
            include_str!("../../../../examples/jobs/torch-ddp.toml"),
            include_str!("../../../../examples/jobs/torch-elastic.toml"),
        ];
        let mut specs: Vec<JobSpec> = examples.iter().map(|t| parse(t)).collect();
        specs.push(tables("[train]\nlrr = 0.1\n"));
        specs.push(tables(
            "[train]\nlr = 1\nepochs = 2\n[model]\nhidden = [3, 4]\n",
        ));
        specs
    }

    #[test]
    fn a_spec_round_trips_through_the_stored_form_unchanged() {
        for spec in specs() {
            let bytes = serde_json::to_vec(&spec).unwrap();
            let back: JobSpec = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, spec, "{}", String::from_utf8_lossy(&bytes));
            assert_eq!(back.trainer(), spec.trainer(), "{}", spec.name);
            assert_eq!(serde_json::to_vec(&back).unwrap(), bytes, "{}", spec.name);
        }
    }

    #[test]
    fn the_stored_form_is_the_tables_as_given() {
        let spec = tables("[train]\nlr = 1\nepochs = 2\n");
        let stored = serde_json::to_value(&spec).unwrap();
        assert_eq!(stored["train"], serde_json::json!({"epochs": 2, "lr": 1}));
        assert_eq!(stored["model"], serde_json::Value::Null);
        assert_eq!(spec.trainer().map(|t| t.train.lr), Some(1.0));
    }

    #[test]
    fn the_typed_reading_follows_the_tables() {
        for spec in specs() {
            // What the parse read over the text is what the tables read.
            assert_eq!(spec.tables().read().ok().as_ref(), spec.trainer.typed());
        }
        let mut spec = tables("[train]\nepochs = 2\n");
        assert_eq!(spec.trainer().map(|t| t.train.epochs), Some(2));
        spec.edit_tables(|t| {
            let train = t.train.as_mut().unwrap();
            train.insert("epochs".into(), toml::Value::Integer(5));
        });
        assert_eq!(spec.trainer().map(|t| t.train.epochs), Some(5));
        spec.edit_tables(|t| {
            let train = t.train.as_mut().unwrap();
            train.insert("lrr".into(), toml::Value::Float(0.1));
        });
        assert_eq!(spec.trainer(), None, "refused tables read as none");
        spec.kind = crate::spec::JobKind::Command;
        assert_eq!(spec.trainer(), None, "only a train job's are used");
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
