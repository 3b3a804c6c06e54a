use super::*;

fn parse(text: &str) -> Result<SearchSpec, SearchError> {
    let doc: toml::Table = toml::from_str(text).expect("test toml");
    SearchSpec::from_table(doc["search"].as_table().expect("[search]"))
}

const FULL: &str = r#"
        [search]
        trial = "train"
        algorithm = "hyperband"
        trials = 40
        max_parallel = 4
        metric = "val_loss"
        direction = "min"
        seed = 7
        resource = "epochs"
        min_resource = 1
        max_resource = 27
        reduction_factor = 3
        stopping = "none"
        max_trial_failures = 5
        speculate_factor = 0
        [[search.params]]
        name = "train.lr"
        type = "double"
        min = 1e-4
        max = 1
        scale = "log"
        [[search.params]]
        name = "train.momentum"
        type = "double"
        min = 0
        max = 0.99
        scale = "reverse_log"
        grid_points = 4
        [[search.params]]
        name = "model.hidden"
        type = "categorical"
        values = [[64], [128, 128], "wide"]
        [[search.params]]
        name = "train.batch_size"
        type = "discrete"
        values = [16, 32, 64.0]
        [[search.params]]
        name = "model.layers"
        type = "integer"
        min = 1
        max = 8
        scale = "log"
    "#;

#[test]
fn a_full_table_parses() {
    let s = parse(FULL).unwrap();
    assert_eq!(s.trial, TrialKind::Train);
    assert_eq!(s.algorithm, Algorithm::Hyperband);
    assert_eq!((s.trials, s.max_parallel), (40, 4));
    assert_eq!(
        (s.metric.as_str(), s.direction),
        ("val_loss", Direction::Min)
    );
    assert_eq!(s.seed, 7);
    assert_eq!((s.min_resource, s.max_resource), (1, Some(27)));
    assert_eq!((s.reduction_factor, s.stopping), (3, Stopping::None));
    assert_eq!((s.max_trial_failures, s.speculate_factor), (5, 0.0));
    assert_eq!(s.params.len(), 5);
    assert_eq!(
        s.params[0],
        ParamSpec {
            name: "train.lr".into(),
            kind: ParamKind::Double {
                min: 1e-4,
                max: 1.0,
                scale: Scale::Log
            },
            grid_points: GRID_POINTS_DEFAULT,
        }
    );
    assert_eq!(s.params[1].grid_points, 4);
    let ParamKind::Categorical { values } = &s.params[2].kind else {
        panic!("categorical expected");
    };
    assert_eq!(values[1], toml::Value::Array(vec![128.into(), 128.into()]));
    assert!(matches!(
        s.params[4].kind,
        ParamKind::Integer {
            min: 1,
            max: 8,
            scale: Scale::Log
        }
    ));
    // The spec round-trips through JSON (the node's log format).
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<SearchSpec>(&json).unwrap(), s);
}

#[test]
fn defaults_fill_in() {
    let s = parse(
        r#"
            [search]
            algorithm = "random"
            trials = 3
            metric = "acc"
            direction = "max"
            [[search.params]]
            name = "lr"
            type = "double"
            min = 0
            max = 1
        "#,
    )
    .unwrap();
    assert_eq!(s.trial, TrialKind::Train);
    assert_eq!(
        (s.max_parallel, s.seed, s.resource.as_str()),
        (0, 0, "epochs")
    );
    assert_eq!((s.min_resource, s.max_resource), (1, None));
    assert_eq!((s.reduction_factor, s.stopping), (3, Stopping::None));
    assert_eq!((s.max_trial_failures, s.speculate_factor), (3, 2.0));
    assert!(
        !s.resumable && s.resumable_trials(),
        "train trials always resume"
    );
}

/// A valid grid search; each bad case edits it.
fn base(algorithm: &str, extra: &str, params: &str) -> String {
    format!(
        r#"
            [search]
            algorithm = "{algorithm}"
            metric = "acc"
            direction = "max"
            {extra}
            [[search.params]]
            name = "train.lr"
            type = "double"
            min = 0.001
            max = 0.1
            [[search.params]]
            name = "model.hidden"
            {params}
        "#
    )
}

const INTEGER: &str = "type = \"integer\"\nmin = 1\nmax = 4";

#[test]
fn grid_trials_default_to_and_are_capped_by_the_grid_size() {
    let s = parse(&base("grid", "", INTEGER)).unwrap();
    assert_eq!(s.trials, 20);
    let s = parse(&base("grid", "trials = 7", INTEGER)).unwrap();
    assert_eq!(s.trials, 7);
    let s = parse(&base("grid", "trials = 700", INTEGER)).unwrap();
    assert_eq!(s.trials, 20);
}

#[test]
fn bad_tables_name_the_offending_field() {
    let cases: &[(String, &str, &str)] = &[
        (
            base("grid", "", "type = \"double\"\nmin = 2\nmax = 1"),
            "search.params[1].max",
            "must be greater than min",
        ),
        (
            base("bayes", "", INTEGER),
            "search.algorithm",
            "unknown algorithm \"bayes\"",
        ),
        (
            base("grid", "", "type = \"categorical\"\nvalues = []"),
            "search.params[1].values",
            "must not be empty",
        ),
        (
            base("grid", "trails = 20", INTEGER),
            "search.trails",
            "unknown field",
        ),
        (
            base("grid", "", "type = \"discrete\"\nvalues = [1, 2, \"x\"]"),
            "search.params[1].values[2]",
            "expected a finite number, found string",
        ),
        (
            base("grid", "", "type = \"categorical\"\nvalues = [[1], [1]]"),
            "search.params[1].values[1]",
            "duplicate of values[0]",
        ),
        (base("random", "", INTEGER), "search.trials", "missing"),
        (
            base("random", "trials = 0", INTEGER),
            "search.trials",
            "at least 1",
        ),
        (
            base(
                "grid",
                "",
                "type = \"integer\"\nmin = 1\nmax = 4\nsteps = 2",
            ),
            "search.params[1].steps",
            "unknown field",
        ),
        (
            base("grid", "", "type = \"integer\"\nmin = 1.5\nmax = 4"),
            "search.params[1].min",
            "expected an integer, found float",
        ),
        (
            base(
                "grid",
                "",
                "type = \"double\"\nmin = 0\nmax = 1\nscale = \"log\"",
            ),
            "search.params[1].min",
            "log scale needs min > 0",
        ),
        (
            base(
                "grid",
                "",
                "type = \"double\"\nmin = 0\nmax = 1\nscale = \"reverse_log\"",
            ),
            "search.params[1].max",
            "reverse_log",
        ),
        (
            base(
                "grid",
                "",
                "type = \"integer\"\nmin = 0\nmax = 1\nscale = \"reverse_log\"",
            ),
            "search.params[1].scale",
            "reverse_log",
        ),
        (
            base("grid", "", "type = \"integer\"\nmax = 1"),
            "search.params[1].min",
            "missing",
        ),
        (
            base("grid", "", "type = \"float\"\nmin = 0\nmax = 1"),
            "search.params[1].type",
            "unknown parameter type \"float\"",
        ),
        (
            base("grid", "", "type = \"categorical\"\nvalues = [1]\nmin = 0"),
            "search.params[1].min",
            "only double and integer",
        ),
        (
            base(
                "grid",
                "",
                "type = \"integer\"\nmin = 1\nmax = 4\ngrid_points = 3",
            ),
            "search.params[1].grid_points",
            "only double",
        ),
        (
            base("grid", "", "type = \"integer\"\nmin = 0\nmax = 5000"),
            "search.params[1].max",
            "too large for a grid",
        ),
        (
            base("grid", "", "type = \"discrete\"\nvalues = 3"),
            "search.params[1].values",
            "expected an array, found integer",
        ),
        (
            base("asha", "trial = \"command\"\ntrials = 9", INTEGER),
            "search.max_resource",
            "missing",
        ),
        (
            base("asha", "trials = 9\nresumable = true", INTEGER),
            "search.resumable",
            "only for command trials",
        ),
        (
            base(
                "asha",
                "trial = \"command\"\ntrials = 9\nmax_resource = 9\nresumable = 1",
                INTEGER,
            ),
            "search.resumable",
            "a boolean",
        ),
        (
            base("asha", "trials = 9\nstopping = \"median\"", INTEGER),
            "search.stopping",
            "median stopping applies to grid",
        ),
        (
            base("grid", "min_resource = 5\nmax_resource = 4", INTEGER),
            "search.max_resource",
            "at least min_resource",
        ),
        (
            base("grid", "reduction_factor = 1", INTEGER),
            "search.reduction_factor",
            "at least 2",
        ),
        (
            base("grid", "speculate_factor = 0.5", INTEGER),
            "search.speculate_factor",
            "greater than 1",
        ),
        (
            base("grid", "seed = -1", INTEGER),
            "search.seed",
            "non-negative",
        ),
        (
            base("grid", "resource = \"steps\"", INTEGER),
            "search.resource",
            "only \"epochs\"",
        ),
        (
            base("grid", "direction2 = \"max\"", INTEGER),
            "search.direction2",
            "unknown field",
        ),
        (
            base("grid", "metric = \"\"", INTEGER).replacen("metric = \"acc\"\n", "", 1),
            "search.metric",
            "must not be empty",
        ),
        (
            base("grid", "", INTEGER).replacen("name = \"model.hidden\"\n", "", 1),
            "search.params[1].name",
            "missing",
        ),
        (
            base("grid", "", INTEGER).replace("model.hidden", "train.lr"),
            "search.params[1].name",
            "duplicate parameter name",
        ),
        (
            base("grid", "", INTEGER).replace("model.hidden", "train"),
            "search.params[1].name",
            "prefix",
        ),
        (
            base("grid", "", INTEGER).replace("model.hidden", "model..hidden"),
            "search.params[1].name",
            "empty path segment",
        ),
        (
            base("grid", "", INTEGER).replace("model.hidden", "model hidden"),
            "search.params[1].name",
            "not allowed",
        ),
    ];
    for (text, field, problem) in cases {
        let err = parse(text).expect_err(text);
        assert_eq!(err.field, *field, "{err} for\n{text}");
        assert!(err.problem.contains(problem), "{err} for\n{text}");
    }
    let err = parse(&base("grid", "trails = 20", INTEGER)).unwrap_err();
    assert_eq!(err.to_string(), "search.trails: unknown field");
}

#[test]
fn a_missing_metric_names_its_key() {
    let text = base("grid", "", INTEGER).replacen("metric = \"acc\"\n", "", 1);
    let err = parse(&text).unwrap_err();
    assert_eq!(err.field, "search.metric");
    assert_eq!(err.to_string(), "search.metric: missing (required)");
    let no_params = "[search]\nalgorithm = \"grid\"\nmetric = \"a\"\ndirection = \"min\"";
    assert_eq!(parse(no_params).unwrap_err().field, "search.params");
}

#[test]
fn the_grid_size_is_capped() {
    let many = "type = \"integer\"\nmin = 1\nmax = 1000";
    let text = format!(
        "{}\n[[search.params]]\nname = \"a\"\n{many}\n[[search.params]]\nname = \"b\"\n{many}",
        base("grid", "", many)
    );
    let err = parse(&text).unwrap_err();
    assert_eq!(err.field, "search.params");
    assert!(err.problem.contains("at most 100000"), "{err}");
}

#[test]
fn train_asha_may_leave_max_resource_to_the_node() {
    let mut s = parse(&base("asha", "trials = 9", INTEGER)).unwrap();
    assert_eq!(s.max_resource, None);
    let err = s.searcher(true).unwrap_err();
    assert_eq!(err.field, "search.max_resource");
    s.max_resource = Some(9);
    assert_eq!(s.searcher(true).unwrap().rungs(0), vec![1, 3, 9]);
}

/// A search of `params` categorical parameters of `values` distinct strings each.
fn wide(params: usize, values: usize) -> String {
    let mut text = String::from(
        "[search]\nalgorithm = \"random\"\ntrials = 10\nmetric = \"m\"\ndirection = \"max\"\n",
    );
    for p in 0..params {
        let list: Vec<String> = (0..values).map(|v| format!("\"v{v}\"")).collect();
        text.push_str(&format!(
            "[[search.params]]\nname = \"p{p}\"\ntype = \"categorical\"\nvalues = [{}]\n",
            list.join(", ")
        ));
    }
    text
}

#[test]
fn values_in_all_params_together_are_capped_naming_the_param() {
    let started = std::time::Instant::now();
    let err = parse(&wide(PARAMS_MAX, VALUES_MAX)).unwrap_err();
    assert_eq!(err.field, "search.params[10].values", "{err}");
    assert!(err.problem.contains("at most 10000"), "{err}");
    // Up to the cap, duplicates are found in linear time.
    let spec = parse(&wide(10, VALUES_MAX)).unwrap();
    assert_eq!(spec.params.len(), 10);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn duplicates_are_found_by_value_as_toml_compares_them() {
    let cases = [
        ("[1, 2.0, 2]", None),
        ("[0.0, -0.0]", Some("values[1]")),
        ("[\"a\", \"b\", \"a\"]", Some("values[2]")),
        ("[[1, 2], [2, 1], [1, 2]]", Some("values[2]")),
        ("[{a = 1}, {a = 1.0}]", None),
        ("[true, false, true]", Some("values[2]")),
    ];
    for (values, dup) in cases {
        let text = base(
            "random",
            "trials = 4",
            &format!("type = \"categorical\"\nvalues = {values}"),
        );
        match (parse(&text), dup) {
            (Ok(_), None) => {}
            (Err(e), Some(at)) => {
                assert!(e.field.ends_with(at), "{values}: {e}");
                assert!(e.problem.contains("duplicate of values["), "{values}: {e}");
            }
            (other, _) => panic!("{values}: {other:?}"),
        }
    }
}

/// The whole message of a value of the wrong type or out of range, field by field: the
/// search's own words from its rules' types, not serde's "invalid type: ...".
#[test]
fn each_fields_rule_words_its_problem() {
    const HEAD: &str =
        "[search]\nalgorithm = \"random\"\ntrials = 4\nmetric = \"a\"\ndirection = \"min\"\n";
    const PARAM: &str =
        "[[search.params]]\nname = \"train.lr\"\ntype = \"double\"\nmin = 0.1\nmax = 1\n";
    let cases = [
        (
            "trial = 3\n",
            "",
            "search.trial: expected a string, found integer",
        ),
        (
            "max_parallel = -1\n",
            "",
            "search.max_parallel: must be at least 0",
        ),
        (
            "trials = 100001\n",
            "",
            "search.trials: must be at most 100000",
        ),
        (
            "seed = -2\n",
            "",
            "search.seed: must be a non-negative integer",
        ),
        (
            "seed = 1.5\n",
            "",
            "search.seed: expected an integer, found float",
        ),
        (
            "speculate_factor = nan\n",
            "",
            "search.speculate_factor: must be finite",
        ),
        (
            "speculate_factor = \"x\"\n",
            "",
            "search.speculate_factor: expected a number, found string",
        ),
        (
            "resumable = \"yes\"\n",
            "",
            "search.resumable: expected a boolean, found string",
        ),
        (
            "stopping = \"early\"\n",
            "",
            "search.stopping: unknown stopping rule \"early\" (expected none, median)",
        ),
        (
            "",
            "grid_points = 1\n",
            "search.params[0].grid_points: must be at least 2",
        ),
        (
            "",
            "scale = 2\n",
            "search.params[0].scale: expected a string, found integer",
        ),
        ("", "steps = 2\n", "search.params[0].steps: unknown field"),
    ];
    for (line, param, want) in cases {
        // A key given twice is not TOML: the case's line replaces the head's for its key.
        let key = format!("{} ", line.split(' ').next().unwrap_or_default());
        let head: String = HEAD
            .lines()
            .filter(|l| line.is_empty() || !l.starts_with(&key))
            .map(|l| format!("{l}\n"))
            .collect();
        let text = format!("{head}{line}{PARAM}{param}");
        let err = parse(&text).expect_err(&text);
        assert_eq!(err.to_string(), want, "for\n{text}");
    }
    let min = PARAM.replace("min = 0.1", "min = \"low\"");
    let err = parse(&format!("{HEAD}{min}")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "search.params[0].min: expected a number, found string"
    );
    let err = parse(&format!("{HEAD}params = [3]\n")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "search.params[0]: expected a table, found integer"
    );
}
