//! A search job's spec: `[search]` with its `[[search.params]]` (parsed and checked by
//! [`ringleader_spec::search::SearchSpec`]), and the rest of the file as the trial template. A
//! search is refused at submit unless every trial it could make would run: the template is
//! admitted as a train (or command) job with every parameter at each end of its range and
//! at each of its values.
//!
//! [`trial_spec`] makes a trial's job spec from the template and the trial's params: a
//! dotted name sets that key of a train trial's tables (`train.lr`, `model.hidden`); a
//! command trial gets `--name value` arguments and `RINGLEADER_PARAM_<NAME>` variables.

use ringleader_spec::search::{Algorithm, ParamKind, Params, SearchError, SearchSpec, TrialKind};

use crate::{
    spec::{JobKind, JobSpec, NAME_BYTES_MAX},
    train_spec,
};

/// Trials' job names end in `-t<id>`; the template's name is cut to leave room for it.
const TRIAL_SUFFIX_BYTES_MAX: usize = 12;

/// A search spec's problem: the field path (`search.params[1].max`, `train.lr`) and what
/// is wrong.
pub type Problem = SearchError;

fn problem(field: &str, what: impl Into<String>) -> Problem {
    SearchError::new(field, what)
}

/// The search's own settings, with `max_resource` filled from the template when the spec
/// leaves it out (a train trial's `train.epochs`).
pub fn search_spec(spec: &JobSpec) -> Result<SearchSpec, Problem> {
    let table = spec
        .search
        .as_ref()
        .ok_or_else(|| problem("search", "required when kind = \"search\""))?;
    let mut s = SearchSpec::from_table(table)?;
    if s.trial == TrialKind::Train && s.max_resource.is_none() {
        let epochs = train_spec::read(&template(spec, &s))?.train.epochs;
        s.max_resource = Some(u32::try_from(epochs).unwrap_or(u32::MAX).max(1));
    }
    Ok(s)
}

/// Checks a search job's spec as a whole: the `[search]` table, the template, and every
/// trial it could make (each parameter at its ends and at each of its values).
pub fn validate(spec: &JobSpec) -> Result<SearchSpec, Problem> {
    let s = search_spec(spec)?;
    if spec.min_workers != spec.workers || spec.max_workers != spec.workers {
        return Err(problem(
            "min_workers",
            "a search's trials are not elastic: leave min_workers and max_workers out",
        ));
    }
    match s.trial {
        TrialKind::Train if !spec.command.is_empty() => {
            return Err(problem(
                "command",
                "a search of train trials has no command (set search.trial = \"command\")",
            ))
        }
        TrialKind::Command if spec.command.is_empty() => {
            return Err(problem(
                "command",
                "required when search.trial = \"command\"",
            ))
        }
        TrialKind::Train if !spec.files.is_empty() => {
            return Err(problem(
                "files",
                "only for command trials (search.trial = \"command\"): a train trial runs the built-in trainer",
            ))
        }
        TrialKind::Command => {
            if let Some(data) = &spec.tables().data {
                // As a command job's: only the shared dataset its ranks get.
                if let Some(key) = data.keys().find(|k| *k != "dataset") {
                    return Err(problem(
                        &format!("data.{key}"),
                        "a command trial's [data] has only dataset (a shared dataset's name)",
                    ));
                }
                if data
                    .get("dataset")
                    .and_then(|d| d.as_str())
                    .is_none_or(str::is_empty)
                {
                    return Err(problem("data.dataset", "expected a shared dataset's name"));
                }
            }
            for (section, table) in spec.tables().by_name() {
                if section != "data" && table.is_some() {
                    return Err(problem(
                        section,
                        "only for train trials (search.trial = \"train\")",
                    ));
                }
            }
        }
        TrialKind::Train => {}
    }
    s.searcher(s.resumable_trials())?;
    let resumable = s.trial == TrialKind::Train;
    if resumable && matches!(s.algorithm, Algorithm::Asha | Algorithm::Hyperband) {
        let epochs = s.max_resource.unwrap_or(1);
        let t = train_spec::read(&template(spec, &s))?;
        if u64::from(epochs) != t.train.epochs
            && spec
                .tables()
                .train
                .as_ref()
                .is_some_and(|t| t.contains_key("epochs"))
        {
            return Err(problem(
                "search.max_resource",
                format!(
                    "{epochs} epochs, but train.epochs is {}: leave one out or make them equal",
                    t.train.epochs
                ),
            ));
        }
    }
    for (i, p) in s.params.iter().enumerate() {
        if resumable && !p.name.contains('.') {
            return Err(problem(
                &format!("search.params[{i}].name"),
                format!(
                    "{:?} is not a path into the trial spec (e.g. \"train.lr\")",
                    p.name
                ),
            ));
        }
    }
    // Every trial must run: each parameter at each end and value, the others at their first.
    let first: Params = s
        .params
        .iter()
        .map(|p| (p.name.clone(), extremes(&p.kind)[0].clone()))
        .collect();
    // The trials are made from the spec without its `[search]` table: cloning that table
    // (every value of every parameter) once per checked value made this quadratic.
    let mut bare = spec.clone();
    bare.search = None;
    for (i, p) in s.params.iter().enumerate() {
        if s.trial != TrialKind::Train {
            // A command trial's values become arguments, which every value makes.
            continue;
        }
        for v in extremes(&p.kind) {
            let mut params = first.clone();
            params.insert(p.name.clone(), v.clone());
            let t = trial_spec(&bare, &s, 0, &params);
            train_spec::read(&t).map_err(|e| {
                if e.field == p.name || e.unknown {
                    problem(
                        &format!("search.params[{i}]"),
                        format!("{} = {v}: {}: {}", p.name, e.field, e.problem),
                    )
                } else {
                    problem(
                        &format!("search.params[{i}]"),
                        format!("{} = {v} makes a trial that cannot run: {e}", p.name),
                    )
                }
            })?;
        }
    }
    Ok(s)
}

/// The values a parameter is checked at: its range's ends, or each of its values.
fn extremes(kind: &ParamKind) -> Vec<toml::Value> {
    match kind {
        ParamKind::Double { min, max, .. } => {
            vec![toml::Value::Float(*min), toml::Value::Float(*max)]
        }
        ParamKind::Integer { min, max, .. } => {
            vec![toml::Value::Integer(*min), toml::Value::Integer(*max)]
        }
        ParamKind::Discrete { values } | ParamKind::Categorical { values } => values.clone(),
    }
}

/// The template as a job of the trial's kind, without the search table.
fn template(spec: &JobSpec, s: &SearchSpec) -> JobSpec {
    let mut t = spec.clone();
    t.kind = match s.trial {
        TrialKind::Train => JobKind::Train,
        TrialKind::Command => JobKind::Command,
    };
    t.search = None;
    t
}

/// The job spec of trial `trial` with `params`. A train trial of ASHA or Hyperband gets
/// `train.epochs` = the search's `max_resource`, so its learning-rate schedule is the whole
/// run's; each of its runs stops at its rung (`TrialOf::target`).
pub fn trial_spec(spec: &JobSpec, s: &SearchSpec, trial: u32, params: &Params) -> JobSpec {
    let mut t = template(spec, s);
    let mut name = spec.name.clone();
    let cut = NAME_BYTES_MAX - TRIAL_SUFFIX_BYTES_MAX;
    if name.len() > cut {
        name.truncate(cut);
    }
    t.name = format!("{name}-t{trial}");
    t.max_restarts = 0;
    match s.trial {
        TrialKind::Train => {
            if matches!(s.algorithm, Algorithm::Asha | Algorithm::Hyperband) {
                if let Some(epochs) = s.max_resource {
                    set_path(
                        &mut t,
                        "train.epochs",
                        toml::Value::Integer(i64::from(epochs)),
                    );
                }
            }
            for (name, value) in params {
                set_path(&mut t, name, value.clone());
            }
        }
        TrialKind::Command => {
            for (name, value) in params {
                let text = arg_text(value);
                t.command.push(format!("--{name}"));
                t.command.push(text.clone());
                t.env.insert(env_name(name), text);
            }
            t.env.insert(PARAMS_ENV.into(), params_json(params));
        }
    }
    t
}

/// The variable that holds a command trial's parameters as one JSON object.
pub use ringleader_protocol::env::PARAMS as PARAMS_ENV;

/// A trial's parameters as a JSON object of name → typed value (`{"lr": 0.01, "width":
/// 64, "opt": "adam"}`): numbers stay numbers, integers integers, as `RINGLEADER_PARAMS`.
pub fn params_json(params: &Params) -> String {
    let object: serde_json::Map<String, serde_json::Value> = params
        .iter()
        .map(|(name, value)| {
            let v = serde_json::to_value(value)
                .unwrap_or_else(|_| serde_json::Value::String(arg_text(value)));
            (name.clone(), v)
        })
        .collect();
    serde_json::Value::Object(object).to_string()
}

/// `RINGLEADER_PARAM_` and the name upper-cased, other characters than letters and digits
/// as `_` (`train.lr` → `RINGLEADER_PARAM_TRAIN_LR`).
pub fn env_name(name: &str) -> String {
    let tail: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{}{tail}", ringleader_protocol::env::PARAM_PREFIX)
}

/// A parameter's value as a command-line argument: a string as it is, anything else as
/// TOML writes it (`0.01`, `[64, 64]`).
pub fn arg_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Sets `section.key` (or deeper) in a train trial's tables.
fn set_path(spec: &mut JobSpec, path: &str, value: toml::Value) {
    let mut parts = path.split('.');
    let Some(section) = parts.next() else { return };
    let rest: Vec<&str> = parts.collect();
    let Some((last, middle)) = rest.split_last() else {
        return;
    };
    spec.edit_tables(|tables| {
        let Some(slot) = tables.by_name_mut(section) else {
            return;
        };
        let mut table = slot.get_or_insert_with(toml::Table::new);
        for key in middle {
            let entry = table
                .entry((*key).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(t) => table = t,
                _ => return,
            }
        }
        table.insert((*last).to_owned(), value);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> JobSpec {
        JobSpec::parse(text).unwrap()
    }

    const ASHA: &str = r#"
name = "s"
kind = "search"
[train]
epochs = 9
lr = 0.1
[search]
algorithm = "asha"
trials = 9
metric = "val_accuracy"
direction = "max"
[[search.params]]
name = "train.lr"
type = "double"
min = 0.001
max = 0.5
scale = "log"
[[search.params]]
name = "model.hidden"
type = "categorical"
values = [[32], [64, 64]]
"#;

    #[test]
    fn a_train_search_is_admitted_and_its_trials_set_the_params() {
        let job = spec(ASHA);
        let s = validate(&job).unwrap();
        assert_eq!(s.max_resource, Some(9), "from train.epochs");
        let mut params = Params::new();
        params.insert("train.lr".into(), toml::Value::Float(0.01));
        params.insert(
            "model.hidden".into(),
            toml::Value::Array(vec![toml::Value::Integer(32)]),
        );
        let t = trial_spec(&job, &s, 4, &params);
        assert_eq!(t.kind, JobKind::Train);
        assert_eq!(t.name, "s-t4");
        assert!(t.search.is_none());
        assert_eq!(
            t.tables().train.as_ref().unwrap()["lr"],
            toml::Value::Float(0.01)
        );
        assert_eq!(
            t.tables().train.as_ref().unwrap()["epochs"],
            toml::Value::Integer(9)
        );
        assert_eq!(
            t.tables().model.as_ref().unwrap()["hidden"],
            toml::Value::Array(vec![toml::Value::Integer(32)])
        );
        crate::train_spec::read(&t).unwrap();
    }

    #[test]
    fn a_param_that_makes_a_bad_trial_is_refused_at_submit() {
        let text = ASHA.replace("name = \"train.lr\"", "name = \"train.lrr\"");
        let e = validate(&spec(&text)).unwrap_err();
        assert_eq!(e.field, "search.params[0]", "{e}");
        assert!(e.problem.contains("unknown field"), "{e}");
        let text = ASHA.replace("values = [[32], [64, 64]]", "values = [[32], \"wide\"]");
        let e = validate(&spec(&text)).unwrap_err();
        assert_eq!(e.field, "search.params[1]", "{e}");
    }

    #[test]
    fn command_trials_get_arguments_and_variables() {
        let job = spec(
            r#"
name = "c"
kind = "search"
command = ["python3", "x.py"]
[search]
trial = "command"
algorithm = "random"
trials = 4
metric = "acc"
direction = "max"
[[search.params]]
name = "lr"
type = "double"
min = 0.01
max = 1.0
"#,
        );
        let s = validate(&job).unwrap();
        let mut params = Params::new();
        params.insert("lr".into(), toml::Value::Float(0.5));
        let t = trial_spec(&job, &s, 0, &params);
        assert_eq!(t.kind, JobKind::Command);
        assert_eq!(t.command, ["python3", "x.py", "--lr", "0.5"]);
        assert_eq!(t.env["RINGLEADER_PARAM_LR"], "0.5");
        let json: serde_json::Value = serde_json::from_str(&t.env[PARAMS_ENV]).unwrap();
        assert_eq!(json, serde_json::json!({"lr": 0.5}));
        // Every type keeps its JSON type: integers, strings, lists.
        params.insert("width".into(), toml::Value::Integer(64));
        params.insert("opt".into(), toml::Value::String("adam".into()));
        params.insert(
            "hidden".into(),
            toml::Value::Array(vec![toml::Value::Integer(32), toml::Value::Integer(16)]),
        );
        let json: serde_json::Value = serde_json::from_str(&params_json(&params)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"lr": 0.5, "width": 64, "opt": "adam", "hidden": [32, 16]})
        );
    }

    #[test]
    fn command_trials_may_carry_files_and_a_dataset_train_trials_not() {
        let command = r#"
name = "c"
kind = "search"
command = ["python3", "x.py"]
[[files]]
path = "x.py"
text = "print(1)"
[data]
dataset = "mnist"
[search]
trial = "command"
algorithm = "random"
trials = 2
metric = "acc"
direction = "max"
[[search.params]]
name = "lr"
type = "double"
min = 0.01
max = 1.0
"#;
        let job = spec(command);
        let s = validate(&job).unwrap();
        let t = trial_spec(&job, &s, 1, &Params::new());
        assert_eq!(t.files, job.files);
        assert_eq!(t.tables().data, job.tables().data);
        let e = validate(&spec(
            &command.replace("dataset = \"mnist\"", "samples = 3"),
        ))
        .unwrap_err();
        assert_eq!(e.field, "data.samples", "{e}");
        let e = validate(&spec(
            &ASHA.replace("[train]", "[[files]]\npath = \"a\"\ntext = \"\"\n[train]"),
        ))
        .unwrap_err();
        assert_eq!(e.field, "files", "{e}");
    }

    #[test]
    fn a_command_search_needs_a_command_and_a_train_search_none() {
        let text = ASHA.replace("[train]", "command = [\"true\"]\n[train]");
        assert_eq!(validate(&spec(&text)).unwrap_err().field, "command");
    }
}
