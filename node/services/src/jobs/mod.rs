//! Jobs: what users submit, and how this node runs its share of them.
//!
//! - [`admit_text`] and [`admit`] are the one gate every spec passes to enter the log. Its
//!   rules are one check on the typed value, the domain's ([`crate::domain::admission::check`]:
//!   every field, a train job's trainer tables, a search's `[search]` and every trial it
//!   could make). The API's text is parsed once and then checked ([`admit_text`],
//!   [`admit_spec_json`] for a JSON spec); a spec another node forwards to the chief is
//!   already a value and gets the check alone ([`admit`], through [`admit_forwarded`],
//!   handed to the control RPC server at start): no trip back through TOML. A property
//!   test holds the two paths together. The spec itself is the domain's (`domain::spec`,
//!   `domain::train_spec`).
//! - [`admission`]: a submit's admission on the API node, the one function the submit route
//!   calls ([`admission::admit_submit`]): the gate, `[secrets]` sealed, an unknown dataset
//!   refused, the sharing rules; the route only maps its refusals to HTTP.
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

pub mod admission;
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

/// The gate on text: the text is parsed once ([`spec::Document`]; a train job's trainer
/// tables are read in that parse and kept typed on the spec, [`JobSpec::trainer`]), then
/// the spec is checked as a value ([`admission::check`], as a forwarded spec is), an
/// error past the parse (a search's) getting its field's line from the same document.
///
/// [`spec::Document`]: crate::domain::spec::Document
/// [`admission::check`]: crate::domain::admission::check
fn admit_document(text: &str) -> Result<JobSpec, SpecError> {
    let doc = crate::domain::spec::Document::parse(text)?;
    let spec = doc.job_spec()?;
    crate::domain::admission::check(&spec).map_err(|e| doc.field_error(e))?;
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

/// Checks a spec that arrived already parsed (a submit forwarded by another node) with
/// the rules the text gate applies past its parse ([`crate::domain::admission::check`]): the
/// value itself, with no trip back through text. The error names the field
/// (`field: problem`; a value has no line).
pub fn admit(spec: &JobSpec) -> Result<(), String> {
    crate::domain::admission::check(spec).map_err(|e| e.to_string())
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
    use crate::domain::spec::{ElasticProtocol, SpecFile};

    #[test]
    fn shipped_specs_survive_a_forward() {
        for text in [
            include_str!("../../../../examples/jobs/digits-mlp.toml"),
            include_str!("../../../../examples/jobs/hello-command.toml"),
            include_str!("../../../../examples/jobs/torch-ddp.toml"),
            include_str!("../../../../examples/jobs/digits-asha.toml"),
            include_str!("../../../../examples/jobs/random-command.toml"),
        ] {
            let spec = admit_text(text).unwrap();
            admit(&spec).unwrap();
            admit_forwarded(&forwarded(&spec)).unwrap();
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

    /// `spec` as another node forwards it: through its stored form (the RPC carries the
    /// serde value), so nothing read from the text comes with it.
    fn forwarded(spec: &JobSpec) -> JobSpec {
        serde_json::from_str(&serde_json::to_string(spec).unwrap()).unwrap()
    }

    #[test]
    fn a_forwarded_spec_meets_the_apis_limits() {
        let text = "name = \"a\"\nkind = \"train\"\nworkers = 2\n[train]\nlr = 0.1\n";
        let spec = forwarded(&admit_text(text).unwrap());
        let mut bad = spec.clone();
        bad.min_workers = 3;
        assert!(admit(&bad).unwrap_err().starts_with("min_workers:"));
        let mut bad = spec.clone();
        bad.name = "no spaces allowed".into();
        assert!(admit(&bad).unwrap_err().starts_with("name:"));
        let mut bad = spec.clone();
        bad.edit_tables(|t| {
            t.train
                .as_mut()
                .unwrap()
                .insert("lrr".into(), toml::Value::Float(0.1))
        });
        assert!(admit(&bad)
            .unwrap_err()
            .starts_with("train.lrr: unknown field"));
        let mut bad = spec;
        bad.env.insert("RANK".into(), "3".into());
        assert!(admit(&bad).unwrap_err().contains("RANK"));
    }

    /// A spec with one bad field, as text and as the value another node could forward:
    /// both gates refuse it naming the same field.
    #[test]
    fn a_forwarded_spec_with_a_bad_field_is_refused_naming_the_field() {
        type Edit = fn(&mut JobSpec);
        let command = "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\n";
        let train = "name = \"t\"\nkind = \"train\"\n[train]\nepochs = 2\n";
        let search = "name = \"s\"\nkind = \"search\"\ncommand = [\"true\"]\n[search]\ntrial = \"command\"\nalgorithm = \"random\"\ntrials = 3\nmetric = \"m\"\ndirection = \"max\"\n[[search.params]]\nname = \"lr\"\ntype = \"double\"\nmin = 0.1\nmax = 0.5\n";
        // A top-level key goes after the name; a table at the end.
        let top = |base: &str, line: &str| base.replacen('\n', &format!("\n{line}"), 1);
        let end = |base: &str, line: &str| format!("{base}{line}");
        fn file(path: &str) -> SpecFile {
            SpecFile {
                path: path.into(),
                text: Some(String::new()),
                base64: None,
            }
        }
        let cases: Vec<(&str, String, Edit, &str)> = vec![
            (
                command,
                command.replace("\"c\"", "\"a b\""),
                |s| s.name = "a b".into(),
                "name",
            ),
            (
                command,
                top(command, "workers = 0\n"),
                |s| s.workers = 0,
                "workers",
            ),
            (
                command,
                top(command, "min_workers = 3\n"),
                |s| s.min_workers = 3,
                "min_workers",
            ),
            (
                command,
                top(command, "workers = 2\nmax_workers = 1\n"),
                |s| {
                    s.workers = 2;
                    s.max_workers = 1;
                },
                "max_workers",
            ),
            (
                command,
                top(command, "max_restarts = 101\n"),
                |s| s.max_restarts = 101,
                "max_restarts",
            ),
            (
                command,
                top(command, "priority = 1001\n"),
                |s| s.priority = 1001,
                "priority",
            ),
            (
                command,
                command.replace("[\"true\"]", "[\"\"]"),
                |s| {
                    s.command = vec![String::new()];
                },
                "command[0]",
            ),
            (
                train,
                top(train, "command = [\"true\"]\n"),
                |s| s.command = vec!["true".into()],
                "command",
            ),
            (
                command,
                end(command, "[env]\nRANK = \"1\"\n"),
                |s| {
                    s.env.insert("RANK".into(), "1".into());
                },
                "env.RANK",
            ),
            (
                command,
                end(command, "[env]\nRINGLEADER_STORAGE = \"x\"\n"),
                |s| {
                    s.env.insert("RINGLEADER_STORAGE".into(), "x".into());
                },
                "env.RINGLEADER_STORAGE",
            ),
            (
                command,
                end(command, "[env]\nA = \"1\"\n[secrets]\nA = \"2\"\n"),
                |s| {
                    s.env.insert("A".into(), "1".into());
                    s.secrets.insert("A".into(), "2".into());
                },
                "secrets.A",
            ),
            (
                command,
                end(command, "[resources]\ncpus_per_worker = 0\n"),
                |s| {
                    s.resources.cpus_per_worker = 0;
                },
                "resources.cpus_per_worker",
            ),
            (
                command,
                end(command, "[search]\nx = 1\n"),
                |s| s.search = Some(toml::Table::new()),
                "search",
            ),
            (
                command,
                end(command, "[data]\npath = \"x\"\n"),
                |s| {
                    let mut data = toml::Table::new();
                    data.insert("path".into(), "x".into());
                    s.edit_tables(|t| t.data = Some(data));
                },
                "data.path",
            ),
            (
                command,
                end(command, "[elastic]\nstraggler_factor = 0.5\n"),
                |s| {
                    s.elastic.straggler_factor = 0.5;
                },
                "elastic.straggler_factor",
            ),
            (
                command,
                end(command, "[elastic]\nprotocol = \"ringleader\"\n"),
                |s| {
                    s.elastic.protocol = ElasticProtocol::Ringleader;
                },
                "elastic.protocol",
            ),
            (
                command,
                end(command, "[preemption]\ngrace_s = 0\n"),
                |s| s.preemption.grace_s = 0,
                "preemption.grace_s",
            ),
            (
                command,
                end(command, "[[files]]\npath = \"/etc/x\"\ntext = \"\"\n"),
                |s| {
                    s.files.push(file("/etc/x"));
                },
                "files[0].path",
            ),
            (
                train,
                end(train, "[[files]]\npath = \"x\"\ntext = \"\"\n"),
                |s| {
                    s.files.push(file("x"));
                },
                "files",
            ),
            (
                train,
                end(train, "lrr = 0.1\n"),
                |s| {
                    s.edit_tables(|t| {
                        t.train
                            .as_mut()
                            .unwrap()
                            .insert("lrr".into(), toml::Value::Float(0.1))
                    });
                },
                "train.lrr",
            ),
            (
                search,
                search.replace("\"random\"", "\"bayes\""),
                |s| {
                    s.search
                        .as_mut()
                        .unwrap()
                        .insert("algorithm".into(), "bayes".into());
                },
                "search.algorithm",
            ),
        ];
        for (base, text, edit, field) in cases {
            let text_field = admit_spec_text(&text).map(|_| ()).unwrap_err().field;
            assert_eq!(text_field.as_deref(), Some(field), "{text}");
            let mut spec = forwarded(&admit_text(base).unwrap());
            edit(&mut spec);
            let e = admit_forwarded(&spec).unwrap_err();
            assert!(e.starts_with(&format!("{field}: ")), "{field}: {e}");
        }
        // Not a key of the text: a spec no node of this version admitted.
        let mut spec = forwarded(&admit_text(command).unwrap());
        spec.reports_required = false;
        assert!(admit(&spec).unwrap_err().starts_with("reports_required: "));
    }

    proptest::proptest! {
        // About one generated spec in seven passes the text gate: enough cases for ~150.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// Whatever spec the text gate accepts, the typed check accepts as parsed and as
        /// forwarded (the forwarded path is that check alone).
        #[test]
        fn the_typed_check_accepts_what_the_text_gate_accepts(
            kind in 0..3usize,
            workers in 0..6u32,
            min_workers in proptest::option::weighted(0.3, 0..7u32),
            max_workers in proptest::option::weighted(0.3, 0..9u32),
            max_restarts in proptest::option::weighted(0.3, 0..102u32),
            priority in proptest::option::weighted(0.3, proptest::sample::select(vec!["\"low\"", "\"high\"", "7", "1000", "1001"])),
            env in proptest::option::weighted(0.3, proptest::sample::select(vec!["A", "_B2", "RANK", "RINGLEADER_NO_SHM", "RINGLEADER_X", "CUDA_DEVICE_ORDER"])),
            secret in proptest::option::weighted(0.3, proptest::sample::select(vec!["A", "S"])),
            cpus in proptest::option::weighted(0.3, 0..3u32),
            straggler in proptest::option::weighted(0.3, proptest::sample::select(vec!["0.5", "1.5", "3"])),
            protocol in proptest::option::weighted(0.3, proptest::sample::select(vec!["torchrun", "ringleader"])),
            grace in proptest::option::weighted(0.3, 0..4000u32),
            file in proptest::option::weighted(0.3, proptest::sample::select(vec!["a.py", "lib/x.py", "../x", "/x"])),
            lr in proptest::option::weighted(0.3, proptest::sample::select(vec!["0.1", "-1", "1e-3"])),
            dataset in proptest::option::weighted(0.3, proptest::sample::select(vec!["digits", ""])),
        ) {
            let mut text = format!("name = \"p\"\nworkers = {workers}\n");
            text += ["kind = \"command\"\ncommand = [\"true\"]\n", "kind = \"train\"\n", "kind = \"search\"\ncommand = [\"true\"]\n"][kind];
            let lines = [
                min_workers.map(|n| format!("min_workers = {n}\n")),
                max_workers.map(|n| format!("max_workers = {n}\n")),
                max_restarts.map(|n| format!("max_restarts = {n}\n")),
                priority.map(|p| format!("priority = {p}\n")),
                env.map(|key| format!("env = {{ {key} = \"PCI_BUS_ID\" }}\n")),
                secret.map(|key| format!("secrets = {{ {key} = \"sealed:v1:x\" }}\n")),
                cpus.map(|n| format!("resources = {{ cpus_per_worker = {n} }}\n")),
                (straggler.is_some() || protocol.is_some()).then(|| "[elastic]\n".to_owned()),
                straggler.map(|f| format!("straggler_factor = {f}\n")),
                protocol.map(|p| format!("protocol = \"{p}\"\n")),
                grace.map(|g| format!("[preemption]\ngrace_s = {g}\n")),
                file.map(|path| format!("[[files]]\npath = \"{path}\"\ntext = \"print(1)\"\n")),
                dataset.map(|d| format!("[data]\ndataset = \"{d}\"\n")),
            ];
            text.extend(lines.into_iter().flatten());
            if let Some(lr) = lr {
                text += &format!("[train]\nlr = {lr}\n");
            }
            if kind == 2 {
                text += "[search]\ntrial = \"command\"\nalgorithm = \"random\"\ntrials = 2\nmetric = \"m\"\ndirection = \"max\"\n[[search.params]]\nname = \"lr\"\ntype = \"double\"\nmin = 0.1\nmax = 0.5\n";
            }
            if let Ok(spec) = admit_text(&text) {
                proptest::prop_assert_eq!(admit(&spec), Ok(()), "{}", text);
                proptest::prop_assert_eq!(admit(&forwarded(&spec)), Ok(()), "{}", text);
            }
        }
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
