//! `kind = "train"` jobs: the trainer's sections of a job spec (`[model]`, `[data]`,
//! `[train]`, `[checkpoint]`), checked when a job is admitted and written to each rank's spec
//! file. Each rank is this node's own binary run as `ringleader train-worker` (see
//! `jobs::launch`), which calls [`trainer::worker::run`]; rank 0 prints `ringleader-metric`
//! lines that become job metrics and writes checkpoints under `jobs/<job-id>/ckpt/<step>/` in
//! the node's store.

use trainer::TrainSpec;

use crate::domain::spec::JobSpec;

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

/// Checks a train job's trainer sections: unknown keys and bad values are refused, the
/// message naming the field (`train.lr: …`).
pub fn validate(spec: &JobSpec) -> Result<TrainSpec, String> {
    let known = known_keys();
    for (name, section) in
        SECTIONS
            .iter()
            .zip([&spec.model, &spec.data, &spec.train, &spec.checkpoint])
    {
        let Some(section) = section else { continue };
        let allowed = known
            .get(*name)
            .and_then(|v| v.as_table())
            .cloned()
            .unwrap_or_default();
        for key in section.keys() {
            if !allowed.contains_key(key) {
                let mut names: Vec<&str> = allowed.keys().map(String::as_str).collect();
                names.sort_unstable();
                return Err(format!(
                    "{name}.{key}: unknown field (known: {})",
                    names.join(", ")
                ));
            }
        }
    }
    TrainSpec::from_toml(&spec_text(spec)).map_err(|e| match e {
        trainer::TrainError::Spec(m) => m,
        other => other.to_string(),
    })
}

/// Every key the trainer's tables accept, from the serialized defaults (plus the optional
/// ones a default leaves out).
fn known_keys() -> toml::Table {
    let mut t: toml::Table = toml::to_string(&TrainSpec::default())
        .ok()
        .and_then(|s| toml::from_str(&s).ok())
        .unwrap_or_default();
    if let Some(toml::Value::Table(train)) = t.get_mut("train") {
        train.insert("max_steps".into(), toml::Value::Integer(0));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> JobSpec {
        JobSpec::parse(text).unwrap()
    }

    #[test]
    fn example_spec_validates() {
        let text = include_str!("../../../examples/jobs/digits-mlp.toml");
        let spec = validate(&parse(text)).unwrap();
        assert_eq!(spec.model.arch, trainer::Arch::Mlp);
    }

    #[test]
    fn bad_fields_are_named() {
        let base = "name = \"a\"\nkind = \"train\"\n";
        let e = validate(&parse(&format!("{base}[train]\nlrr = 0.1\n"))).unwrap_err();
        assert!(e.starts_with("train.lrr: unknown field"), "{e}");
        let e = validate(&parse(&format!("{base}[train]\noptimizer = \"sgdd\"\n"))).unwrap_err();
        assert!(e.contains("optimizer"), "{e}");
        let e = validate(&parse(&format!("{base}[model]\nhidden = [0]\n"))).unwrap_err();
        assert!(e.contains("model.hidden"), "{e}");
        assert!(validate(&parse(&format!("{base}[train]\nmax_steps = 5\n"))).is_ok());
    }
}
