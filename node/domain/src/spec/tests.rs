use super::*;

fn err(text: &str) -> String {
    JobSpec::parse(text)
        .expect_err("spec should be refused")
        .to_string()
}

const HELLO: &str = r#"
name = "hello"
kind = "command"
workers = 2
command = ["sh", "-c", "echo rank $RANK"]
"#;

#[test]
fn minimal_command_spec_gets_defaults() {
    let spec = JobSpec::parse(HELLO).unwrap();
    assert_eq!(spec.name, "hello");
    assert_eq!(spec.kind, JobKind::Command);
    assert_eq!(
        (spec.workers, spec.min_workers, spec.max_workers),
        (2, 2, 2)
    );
    assert_eq!(spec.max_restarts, MAX_RESTARTS_DEFAULT);
    assert_eq!(spec.placement, Placement::Spread);
    assert_eq!(
        spec.resources,
        Resources {
            cpus_per_worker: 1,
            gpus_per_worker: 0
        }
    );
    assert_eq!(spec.command, vec!["sh", "-c", "echo rank $RANK"]);
    assert!(spec.env.is_empty() && spec.tables().model.is_none() && spec.search.is_none());
}

#[test]
fn design_train_example_parses_with_sections() {
    let text = include_str!("../../../../examples/jobs/digits-mlp.toml");
    let spec = JobSpec::parse(text).unwrap();
    assert_eq!(spec.kind, JobKind::Train);
    assert_eq!(spec.workers, 3);
    assert_eq!(spec.resources.gpus_per_worker, 0);
    let model = spec.tables().model.as_ref().unwrap();
    assert_eq!(model["arch"].as_str(), Some("mlp"));
    assert_eq!(
        spec.tables().train.as_ref().unwrap()["lr"].as_float(),
        Some(0.05)
    );
    assert_eq!(
        spec.tables().checkpoint.as_ref().unwrap()["keep"].as_integer(),
        Some(3)
    );
    assert!(spec.search.is_none());
}

#[test]
fn hello_command_example_parses() {
    let text = include_str!("../../../../examples/jobs/hello-command.toml");
    let spec = JobSpec::parse(text).unwrap();
    assert_eq!(spec.kind, JobKind::Command);
    assert_eq!(spec.workers, 2);
    assert_eq!(spec.command[0], "sh");
    assert!(spec.command[2].contains("ringleader-metric answer 42"));
}

#[test]
fn search_spec_with_params_array_of_tables() {
    let spec = JobSpec::parse(
        r#"
name = "digits-asha"
kind = "search"
workers = 1
[search]
algorithm = "asha"
trials = 8
[[search.params]]
name = "lr"
type = "double"
min = 1e-4
max = 0.3
"#,
    )
    .unwrap();
    let search = spec.search.unwrap();
    assert_eq!(search["params"].as_array().unwrap().len(), 1);
}

#[test]
fn workers_not_positive_names_field_and_line() {
    let text = "name = \"a\"\nkind = \"train\"\n\nworkers = 0\n";
    assert_eq!(err(text), "workers: expected a positive integer at line 4");
    let text = "name = \"a\"\nkind = \"train\"\n\nworkers = \"four\"\n";
    assert_eq!(err(text), "workers: expected a positive integer at line 4");
    let text = "name = \"a\"\nkind = \"train\"\n\nworkers = 2.0\n";
    assert_eq!(err(text), "workers: expected a positive integer at line 4");
    let text = "name = \"a\"\nkind = \"train\"\nworkers = -3\n";
    assert_eq!(err(text), "workers: expected a positive integer at line 3");
}

#[test]
fn workers_over_limit() {
    let text = format!(
        "name = \"a\"\nkind = \"train\"\nworkers = {}\n",
        WORKERS_MAX + 1
    );
    assert_eq!(
        err(&text),
        format!(
            "workers: must be at most {WORKERS_MAX}, got {} at line 3",
            WORKERS_MAX + 1
        )
    );
    let text = "name = \"a\"\nkind = \"train\"\nworkers = 99999999999999999999\n";
    assert_eq!(err(text), "workers: expected a positive integer at line 3");
}

#[test]
fn unknown_field_with_line_and_suggestion() {
    let text = "name = \"a\"\nkind = \"train\"\nwrokers = 2\n";
    let e = JobSpec::parse(text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown field \"wrokers\" at line 3 (did you mean \"workers\"?)"
    );
    assert_eq!((e.field(), e.line()), (Some("wrokers"), Some(3)));
    let text = "name = \"a\"\nkind = \"train\"\nflavour = 2\n";
    assert_eq!(err(text), "unknown field \"flavour\" at line 3");
}

#[test]
fn unknown_nested_resource_field() {
    let text =
        "name = \"a\"\nkind = \"train\"\n[resources]\ngpus_per_worker = 1\ngpu_per_worker = 1\n";
    assert_eq!(
            err(text),
            "unknown field \"resources.gpu_per_worker\" at line 5 (did you mean \"resources.gpus_per_worker\"?)"
        );
}

#[test]
fn first_unknown_field_in_text_order_wins() {
    let text = "name = \"a\"\nzzz = 1\nkind = \"train\"\naaa = 2\n";
    assert_eq!(err(text), "unknown field \"zzz\" at line 2");
}

#[test]
fn command_required_and_non_empty_for_command_jobs() {
    let text = "name = \"a\"\nkind = \"command\"\n";
    let e = err(text);
    assert!(
        e.starts_with("command: required when kind = \"command\" (kind at line 2)"),
        "{e}"
    );
    let text = "name = \"a\"\nkind = \"command\"\ncommand = []\n";
    assert!(err(text).starts_with("command: expected a non-empty array of strings"));
    let text = "name = \"a\"\nkind = \"command\"\ncommand = \"python3 train.py\"\n";
    assert!(err(text).ends_with("at line 3"));
    let text = "name = \"a\"\nkind = \"command\"\ncommand = [\n  \"python3\",\n  7,\n]\n";
    assert_eq!(err(text), "command[1]: expected a string at line 5");
    let text = "name = \"a\"\nkind = \"command\"\ncommand = [\"\", \"x\"]\n";
    assert_eq!(
        err(text),
        "command[0]: the program must not be empty at line 3"
    );
}

#[test]
fn command_refused_for_train_jobs() {
    let text = "name = \"a\"\nkind = \"train\"\ncommand = [\"x\"]\n";
    assert_eq!(
            err(text),
            "command: only allowed when kind = \"command\" or \"search\" (command trials), not \"train\" at line 3"
        );
}

#[test]
fn search_section_required_for_search_and_only_there() {
    let e = err("name = \"a\"\nkind = \"search\"\n");
    assert_eq!(
        e,
        "search: required when kind = \"search\" (kind at line 2)"
    );
    let e = err("name = \"a\"\nkind = \"train\"\n[search]\ntrials = 3\n");
    assert_eq!(
        e,
        "search: only allowed when kind = \"search\", not \"train\" at line 3"
    );
}

#[test]
fn name_rules() {
    assert_eq!(err("kind = \"train\"\n"), "name: required");
    for bad in [
        "\"\"",
        "\"has space\"",
        "\"slash/y\"",
        "3",
        &format!("\"{}\"", "x".repeat(NAME_BYTES_MAX + 1)),
    ] {
        let text = format!("kind = \"train\"\nname = {bad}\n");
        let e = err(&text);
        assert!(
            e.starts_with("name: expected a non-empty string"),
            "{bad}: {e}"
        );
        assert!(e.ends_with("at line 2"), "{bad}: {e}");
    }
    assert!(JobSpec::parse("name = \"a.b-c_9\"\nkind = \"train\"\n").is_ok());
}

#[test]
fn kind_rules() {
    assert_eq!(
        err("name = \"a\"\n"),
        "kind: required (one of train, search, command)"
    );
    assert_eq!(
        err("name = \"a\"\nkind = \"Train\"\n"),
        "kind: expected \"train\", \"search\" or \"command\" at line 2"
    );
}

#[test]
fn elastic_bounds() {
    let base = "name = \"a\"\nkind = \"train\"\nworkers = 4\n";
    let spec = JobSpec::parse(&format!("{base}min_workers = 2\nmax_workers = 8\n")).unwrap();
    assert_eq!(
        (spec.min_workers, spec.workers, spec.max_workers),
        (2, 4, 8)
    );
    assert_eq!(
        err(&format!("{base}min_workers = 5\n")),
        "min_workers: must be at most workers (4), got 5 at line 4"
    );
    assert_eq!(
        err(&format!("{base}max_workers = 3\n")),
        "max_workers: must be at least workers (4), got 3 at line 4"
    );
    assert_eq!(
        err(&format!("{base}min_workers = 0\n")),
        "min_workers: expected a positive integer at line 4"
    );
}

/// `elastic.rejoin_after_s`: read, bounded, printed back, and left out of the log when the
/// default (a log written before the key reads alike).
#[test]
fn rejoin_after_s_is_read_bounded_and_left_out_of_the_log_at_its_default() {
    let base = "name = \"a\"\nkind = \"train\"\nworkers = 3\nmin_workers = 2\n[elastic]\n";
    let spec = JobSpec::parse(&format!("{base}rejoin_after_s = 2\n")).unwrap();
    assert_eq!(spec.elastic.rejoin_after_ms(), 2_000);
    assert!(spec.to_toml().contains("rejoin_after_s = 2"));
    assert!(serde_json::to_string(&spec)
        .unwrap()
        .contains("\"rejoin_after_s\":2"));
    assert_eq!(
        err(&format!("{base}rejoin_after_s = 0\n")),
        "elastic.rejoin_after_s: expected a positive integer at line 6"
    );
    let default = JobSpec::parse(base).unwrap();
    assert_eq!(default.elastic.rejoin_after_s, REJOIN_AFTER_S_DEFAULT);
    let json = serde_json::to_string(&default).unwrap();
    assert!(!json.contains("rejoin_after_s"), "{json}");
    let back: JobSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(back, default);
}

#[test]
fn elastic_protocol_on_command_jobs() {
    let base =
        "name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 3\nmin_workers = 2\n";
    // The default: torchrun's restart-all; ranks are started again at each generation.
    let spec = JobSpec::parse(base).unwrap();
    assert_eq!(spec.elastic.protocol, ElasticProtocol::Torchrun);
    assert!(!spec.keeps_ranks_through_reforms());
    let spec = JobSpec::parse(&format!(
        "{base}[elastic]\nprotocol = \"ringleader\"\nfirst_heartbeat_s = 5\n"
    ))
    .unwrap();
    assert_eq!(spec.elastic.protocol, ElasticProtocol::Ringleader);
    assert_eq!(spec.elastic.first_heartbeat_s, 5);
    assert!(spec.keeps_ranks_through_reforms());
    assert_eq!(JobSpec::parse(&spec.to_toml()).unwrap(), spec, "round trip");
    let spec = JobSpec::parse(&format!("{base}elastic.protocol = \"ringleader\"\n")).unwrap();
    assert_eq!(spec.elastic.first_heartbeat_s, FIRST_HEARTBEAT_S_DEFAULT);
    let torchrun = JobSpec::parse(&format!("{base}elastic.protocol = \"torchrun\"\n")).unwrap();
    assert_eq!(torchrun, JobSpec::parse(base).unwrap());
    // JSON specs (the API's) mean the same.
    let json = r#"{"name": "a", "kind": "command", "command": ["true"], "workers": 3,
            "min_workers": 2, "elastic": {"protocol": "ringleader", "first_heartbeat_s": 5}}"#;
    let from_json = JobSpec::parse(&JobSpec::toml_of_json(json).unwrap()).unwrap();
    assert_eq!(from_json.elastic.protocol, ElasticProtocol::Ringleader);
    assert_eq!(from_json.elastic.first_heartbeat_s, 5);
    let e = JobSpec::parse(
        &JobSpec::toml_of_json(&json.replace("\"ringleader\"", "\"horovod\"")).unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("elastic.protocol"), "{e}");

    // Errors name the field and its line.
    assert_eq!(
        err(&format!("{base}[elastic]\nprotocol = \"Ringleader\"\n")),
        "elastic.protocol: expected \"ringleader\" or \"torchrun\" at line 7"
    );
    assert_eq!(
        err(&format!("{base}[elastic]\nprotocol = 1\n")),
        "elastic.protocol: expected \"ringleader\" or \"torchrun\" at line 7"
    );
    let fixed = "name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 3\n";
    assert!(
        err(&format!("{fixed}[elastic]\nprotocol = \"ringleader\"\n")).starts_with(
            "elastic.protocol: \"ringleader\" keeps ranks through a re-form of an elastic ring"
        ),
    );
    assert!(JobSpec::parse(&format!("{fixed}[elastic]\nprotocol = \"torchrun\"\n")).is_ok());
    let train = "name = \"a\"\nkind = \"train\"\nworkers = 3\nmin_workers = 2\n";
    assert_eq!(
            err(&format!("{train}[elastic]\nprotocol = \"ringleader\"\n")),
            "elastic.protocol: only for kind = \"command\", not \"train\" (a train job's ranks always speak the ringleader protocol) at line 6"
        );
    let search =
        "name = \"s\"\nkind = \"search\"\ncommand = [\"true\"]\n[search]\ntrial = \"command\"\n";
    assert_eq!(
            err(&format!("{search}[elastic]\nprotocol = \"torchrun\"\n")),
            "elastic.protocol: only for kind = \"command\", not \"search\" (a search's trials are not elastic) at line 7"
        );
    assert_eq!(
            err(&format!("{base}[elastic]\nfirst_heartbeat_s = 5\n")),
            "elastic.first_heartbeat_s: only with protocol = \"ringleader\" (the ranks that must speak the protocol) at line 7"
        );
    assert_eq!(
        err(&format!(
            "{base}[elastic]\nprotocol = \"ringleader\"\nfirst_heartbeat_s = 0\n"
        )),
        "elastic.first_heartbeat_s: expected a positive integer at line 8"
    );
    assert_eq!(
        err(&format!(
            "{base}[elastic]\nprotocol = \"ringleader\"\nfirst_heartbeat_s = 3601\n"
        )),
        "elastic.first_heartbeat_s: must be at most 3600, got 3601 at line 8"
    );
    assert!(err(&format!("{base}[elastic]\nprotcol = \"ringleader\"\n"))
        .contains("did you mean \"elastic.protocol\""));
}

#[test]
fn max_restarts_and_placement() {
    let base = "name = \"a\"\nkind = \"train\"\n";
    let spec = JobSpec::parse(&format!("{base}max_restarts = 0\nplacement = \"pack\"\n")).unwrap();
    assert_eq!((spec.max_restarts, spec.placement), (0, Placement::Pack));
    assert_eq!(
        err(&format!("{base}max_restarts = -1\n")),
        "max_restarts: expected a non-negative integer at line 3"
    );
    assert_eq!(
        err(&format!("{base}max_restarts = 101\n")),
        "max_restarts: must be at most 100, got 101 at line 3"
    );
    assert_eq!(
        err(&format!("{base}placement = \"random\"\n")),
        "placement: expected \"spread\" or \"pack\" at line 3"
    );
}

#[test]
fn resources_rules() {
    let base = "name = \"a\"\nkind = \"train\"\n";
    let spec = JobSpec::parse(&format!(
        "{base}[resources]\ncpus_per_worker = 4\ngpus_per_worker = 2\n"
    ))
    .unwrap();
    assert_eq!(
        spec.resources,
        Resources {
            cpus_per_worker: 4,
            gpus_per_worker: 2
        }
    );
    let spec = JobSpec::parse(&format!("{base}resources.gpus_per_worker = 1\n")).unwrap();
    assert_eq!(
        spec.resources,
        Resources {
            cpus_per_worker: 1,
            gpus_per_worker: 1
        }
    );
    assert_eq!(
        err(&format!("{base}[resources]\ncpus_per_worker = 0\n")),
        "resources.cpus_per_worker: expected a positive integer at line 4"
    );
    assert_eq!(
        err(&format!("{base}[resources]\ngpus_per_worker = -1\n")),
        "resources.gpus_per_worker: expected a non-negative integer at line 4"
    );
    assert_eq!(
        err(&format!("{base}resources = 3\n")),
        "resources: expected a table at line 3"
    );
}

#[test]
fn secrets_rules() {
    let base = "name = \"x\"\nkind = \"command\"\ncommand = [\"true\"]\n";
    let spec =
        JobSpec::parse(&format!("{base}[secrets]\nAWS_SECRET_ACCESS_KEY = \"s\"\n")).unwrap();
    assert_eq!(spec.secrets["AWS_SECRET_ACCESS_KEY"], "s");
    assert!(spec.env.is_empty());
    assert_eq!(JobSpec::parse(&spec.to_toml()).unwrap(), spec, "round trip");
    assert!(
        err(&format!("{base}[env]\nA = \"1\"\n[secrets]\nA = \"2\"\n"))
            .starts_with("secrets.A: env.A sets it too")
    );
    assert!(err(&format!("{base}[secrets]\nRANK = \"2\"\n")).starts_with("secrets.RANK: reserved"));
    assert!(
        err(&format!("{base}[secrets]\nRINGLEADER_SECRET = \"2\"\n"))
            .starts_with("secrets.RINGLEADER_SECRET: reserved")
    );
    assert!(err(&format!("{base}secrets = 1\n")).starts_with("secrets: expected a table"));
    // Specs logged before `[secrets]` existed load as before.
    let mut old = serde_json::to_value(&spec).unwrap();
    old.as_object_mut().unwrap().remove("secrets");
    let back: JobSpec = serde_json::from_value(old).unwrap();
    assert!(back.secrets.is_empty());
}

#[test]
fn env_rules() {
    let base = "name = \"a\"\nkind = \"command\"\ncommand = [\"x\"]\n";
    let spec = JobSpec::parse(&format!("{base}[env]\nOMP_NUM_THREADS = \"1\"\n")).unwrap();
    assert_eq!(spec.env["OMP_NUM_THREADS"], "1");
    assert_eq!(
        err(&format!("{base}[env]\nA = \"1\"\nRANK = \"3\"\n")),
        "env.RANK: reserved: ringleader sets it for every worker at line 6"
    );
    assert_eq!(
        err(&format!("{base}[env]\nN = 1\n")),
        "env.N: expected a string at line 5"
    );
    for key in [
        "RINGLEADER_TEST_HANG",
        "RINGLEADER_SECRET",
        "RINGLEADER_STORAGE",
    ] {
        assert_eq!(
                err(&format!("{base}[env]\n{key} = \"1\"\n")),
                format!("env.{key}: reserved: the node owns the RINGLEADER_* variables (a job may set only RINGLEADER_NO_SHM, RINGLEADER_CUDA_BACKEND) at line 5")
            );
    }
    let spec = JobSpec::parse(&format!("{base}[env]\nRINGLEADER_NO_SHM = \"true\"\n")).unwrap();
    assert_eq!(spec.env["RINGLEADER_NO_SHM"], "true");
    let spec = JobSpec::parse(&format!(
        "{base}[env]\nRINGLEADER_CUDA_BACKEND = \"none\"\n"
    ))
    .unwrap();
    assert_eq!(spec.env["RINGLEADER_CUDA_BACKEND"], "none");
    assert_eq!(
        err(&format!("{base}[env]\nCUDA_VISIBLE_DEVICES = \"0\"\n")),
        "env.CUDA_VISIBLE_DEVICES: reserved: the node gives each rank its GPUs (see [resources] gpus_per_worker) at line 5"
    );
    assert!(
        err(&format!(
            "{base}[env]\nCUDA_DEVICE_ORDER = \"FASTEST_FIRST\"\n"
        ))
        .starts_with("env.CUDA_DEVICE_ORDER: the node numbers GPUs in PCI bus order"),
        "another device order is refused"
    );
    let spec = JobSpec::parse(&format!(
        "{base}[env]\nCUDA_DEVICE_ORDER = \"PCI_BUS_ID\"\n"
    ))
    .unwrap();
    assert_eq!(spec.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(err(&format!("{base}[env]\n\"1X\" = \"a\"\n"))
        .starts_with("env.1X: expected a variable name"));
    assert_eq!(
        err(&format!("{base}env = [\"A=1\"]\n")),
        "env: expected a table of NAME = \"value\" at line 4"
    );
}

#[test]
fn generic_sections_must_be_tables_with_finite_floats() {
    let base = "name = \"a\"\nkind = \"train\"\n";
    assert_eq!(
        err(&format!("{base}model = \"mlp\"\n")),
        "model: expected a table at line 3"
    );
    assert_eq!(
        err(&format!("{base}[train]\nlr = nan\n")),
        "train.lr: expected a finite number at line 4"
    );
    assert_eq!(
        err(&format!("{base}[model]\nhidden = [1.0, inf]\n")),
        "model.hidden[1]: expected a finite number at line 4"
    );
}

#[test]
fn syntax_errors_carry_the_line() {
    let e = JobSpec::parse("name = \"a\"\nkind = \"train\"\nworkers = = 3\n").unwrap_err();
    assert!(matches!(e, SpecError::Syntax { line: 3, .. }), "{e}");
    let e = JobSpec::parse("name = \"a\"\nname = \"b\"\n").unwrap_err();
    assert!(matches!(e, SpecError::Syntax { line: 2, .. }), "{e}");
    assert!(e.to_string().starts_with("invalid TOML at line 2: "), "{e}");
}

#[test]
fn oversized_text_refused_before_parsing() {
    let text = " ".repeat(SPEC_BYTES_MAX + 1);
    assert!(matches!(
        JobSpec::parse(&text),
        Err(SpecError::TooLarge { .. })
    ));
}

#[test]
fn spec_roundtrips_through_json() {
    let spec = JobSpec::parse(include_str!("../../../../examples/jobs/digits-mlp.toml")).unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let back: JobSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(spec, back);
}

#[test]
fn datetimes_and_nested_tables_roundtrip_through_json() {
    let spec = JobSpec::parse(
            // A search's template: tables the parse keeps generic (a train job's are the
            // trainer's, which has no such keys).
            "name = \"a\"\nkind = \"search\"\n[search]\nx = 1\n[data]\nas_of = 1979-05-27T07:32:00Z\n[data.extra]\nk = [1, 2.5, \"x\"]\n",
        )
        .unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    let back: JobSpec = serde_json::from_str(&json).unwrap();
    assert_eq!(spec, back);
}

const FILES: &str = "name = \"f\"\nkind = \"command\"\ncommand = [\"python3\", \"train.py\"]\n";

#[test]
fn files_ride_in_the_spec_as_text_or_base64() {
    let text = format!(
            "{FILES}[[files]]\npath = \"train.py\"\ntext = \"print('hi')\\n\"\n[[files]]\npath = \"lib/fn.pkl\"\nbase64 = \"AAEC/w==\"\n"
        );
    let spec = JobSpec::parse(&text).unwrap();
    assert_eq!(spec.files.len(), 2);
    assert_eq!(spec.files[0].path, "train.py");
    assert_eq!(spec.files[0].bytes().unwrap(), b"print('hi')\n");
    assert_eq!(spec.files[1].bytes().unwrap(), [0, 1, 2, 255]);
    // Written back, read back: the same spec (a forward), and through the Raft log's JSON.
    assert_eq!(JobSpec::parse(&spec.to_toml()).unwrap(), spec);
    let back: JobSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
    assert_eq!(back, spec);
    // A spec without files writes no `files` key: logs of earlier versions read the same.
    let plain = JobSpec::parse(FILES).unwrap();
    assert!(!serde_json::to_string(&plain).unwrap().contains("files"));
}

#[test]
fn file_paths_stay_inside_the_working_directory() {
    for (path, problem) in [
        ("/etc/passwd", "is absolute"),
        ("../x.py", "\"..\" component"),
        ("a/../../x", "\"..\" component"),
        ("./x.py", "\".\" component"),
        ("a//b", "empty component"),
        ("a/", "empty component"),
        ("", "expected a relative path"),
    ] {
        let e = err(&format!(
            "{FILES}[[files]]\npath = {path:?}\ntext = \"x\"\n"
        ));
        assert!(e.starts_with("files[0].path: "), "{path}: {e}");
        assert!(e.contains(problem), "{path}: {e}");
        assert!(e.ends_with("at line 5"), "{path}: {e}");
    }
    let long = "a".repeat(FILE_PATH_BYTES_MAX + 1);
    assert!(file_path_problem(&long).unwrap().contains("at most"));
    assert_eq!(file_path_problem("src/model/net.py"), None);
    assert_eq!(file_path_problem("..hidden/.x"), None);
}

#[test]
fn file_errors_name_their_field() {
    let one = |body: &str| err(&format!("{FILES}[[files]]\n{body}"));
    assert_eq!(
        one("text = \"x\"\n"),
        "files[0].path: required, e.g. path = \"train.py\" at line 4"
    );
    assert_eq!(
        one("path = \"a\"\n"),
        "files[0].text: required: the contents as text = \"…\" or base64 = \"…\" at line 4"
    );
    assert!(one("path = \"a\"\ntext = \"x\"\nbase64 = \"eA==\"\n")
        .starts_with("files[0].base64: give text or base64, not both at line 7"));
    assert!(one("path = \"a\"\nbase64 = \"not base64!\"\n")
        .starts_with("files[0].base64: not standard base64"));
    assert!(one("path = \"a\"\ntext = 3\n").starts_with("files[0].text: expected a string"));
    assert!(one("path = \"a\"\ntxt = \"x\"\n")
        .starts_with("unknown field \"files[0].txt\" at line 6 (did you mean \"files[0].text\"?)"));
    assert!(one("path = 3\ntext = \"\"\n").starts_with("files[0].path: expected a relative path"));
    let e = err(&format!(
        "{FILES}[[files]]\npath = \"a\"\ntext = \"\"\n[[files]]\npath = \"a/b\"\ntext = \"\"\n"
    ));
    assert_eq!(
        e,
        "files[1].path: \"a/b\" clashes with files[0].path \"a\" at line 8"
    );
    let e = err(&format!(
        "{FILES}[[files]]\npath = \"a\"\ntext = \"\"\n[[files]]\npath = \"a\"\ntext = \"\"\n"
    ));
    assert!(e.starts_with("files[1].path: \"a\" clashes"), "{e}");
    assert_eq!(
        err(&format!("{FILES}files = \"train.py\"\n")),
        "files: expected an array of tables [[files]] with path and text or base64 at line 4"
    );
    // Only command jobs (and searches, checked with their trial kind) carry files.
    let e = err("name = \"t\"\nkind = \"train\"\n[[files]]\npath = \"a\"\ntext = \"\"\n");
    assert!(e.starts_with("files: only for kind = \"command\""), "{e}");
}

#[test]
fn files_have_a_size_limit_in_all() {
    let half = "x".repeat(FILES_BYTES_MAX / 2);
    let ok = format!(
            "{FILES}[[files]]\npath = \"a\"\ntext = \"{half}\"\n[[files]]\npath = \"b\"\ntext = \"{half}\"\n"
        );
    JobSpec::parse(&ok).unwrap();
    let e = err(&format!("{ok}[[files]]\npath = \"c\"\ntext = \"x\"\n"));
    assert!(
        e.starts_with(&format!(
            "files[2]: the files come to {} bytes",
            FILES_BYTES_MAX + 1
        )),
        "{e}"
    );
    let many: String = (0..=FILES_MAX)
        .map(|i| format!("[[files]]\npath = \"f{i}\"\ntext = \"\"\n"))
        .collect();
    let e = err(&format!("{FILES}{many}"));
    assert!(
        e.starts_with(&format!("files: at most {FILES_MAX} files")),
        "{e}"
    );
}

#[test]
fn a_command_jobs_data_names_only_a_dataset() {
    let spec = JobSpec::parse(&format!("{FILES}[data]\ndataset = \"mnist\"\n")).unwrap();
    assert_eq!(
        spec.tables().data.as_ref().unwrap()["dataset"].as_str(),
        Some("mnist")
    );
    assert_eq!(
        err(&format!(
            "{FILES}[data]\ndataset = \"mnist\"\nsamples = 3\n"
        )),
        "data.samples: a command job's [data] has only dataset (a shared dataset's name) at line 6"
    );
    assert_eq!(
        err(&format!("{FILES}[data]\ndataset = 3\n")),
        "data.dataset: expected a shared dataset's name at line 5"
    );
}

#[test]
fn a_json_spec_is_the_toml_with_the_same_keys() {
    let json = r#"{"name": "j", "kind": "command", "workers": 2,
            "command": ["python3", "train.py"], "env": {"A": "1"},
            "resources": {"cpus_per_worker": 2}, "data": {"dataset": "mnist"},
            "files": [{"path": "train.py", "text": "print(1)"}]}"#;
    let from_json = JobSpec::parse(&JobSpec::toml_of_json(json).unwrap()).unwrap();
    let from_toml = JobSpec::parse(
            "name = \"j\"\nkind = \"command\"\nworkers = 2\ncommand = [\"python3\", \"train.py\"]\n[env]\nA = \"1\"\n[resources]\ncpus_per_worker = 2\n[data]\ndataset = \"mnist\"\n[[files]]\npath = \"train.py\"\ntext = \"print(1)\"\n",
        )
        .unwrap();
    assert_eq!(from_json, from_toml);
    // A search: arrays of objects are arrays of tables, floats stay floats.
    let json = r#"{"name": "s", "kind": "search", "train": {"epochs": 3, "lr": 0.1},
            "search": {"algorithm": "random", "trials": 2, "metric": "val_accuracy",
            "direction": "max", "params": [{"name": "train.lr", "type": "double",
            "min": 1e-3, "max": 0.5, "scale": "log"}]}}"#;
    let spec = JobSpec::parse(&JobSpec::toml_of_json(json).unwrap()).unwrap();
    let params = spec.search.unwrap()["params"].as_array().unwrap().clone();
    assert_eq!(params[0]["min"].as_float(), Some(1e-3));
}

#[test]
fn json_spec_errors_name_the_line_and_column_or_the_field() {
    let e = JobSpec::toml_of_json("{\"name\": \"a\",\n \"kind\": }").unwrap_err();
    assert!(
        matches!(
            e,
            SpecError::Json {
                line: 2,
                column: 10,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("invalid JSON at line 2 column 10: "),
        "{e}"
    );
    let e = JobSpec::toml_of_json("{\"name\": \"a\", \"resources\": {\"gpus_per_worker\": null}}")
        .unwrap_err();
    assert_eq!(e.field(), Some("resources.gpus_per_worker"));
    assert!(e.to_string().contains("null has no TOML form"), "{e}");
    let e = JobSpec::toml_of_json("{\"files\": [{\"path\": null}]}").unwrap_err();
    assert_eq!(e.field(), Some("files[0].path"));
    let e = JobSpec::toml_of_json("{\"workers\": 18446744073709551615}").unwrap_err();
    assert_eq!(e.field(), Some("workers"));
    let e = JobSpec::toml_of_json("[1, 2]").unwrap_err();
    assert_eq!(e.field(), Some("spec"));
    let big = format!("{{\"name\": \"{}\"}}", "x".repeat(SPEC_BYTES_MAX));
    assert!(matches!(
        JobSpec::toml_of_json(&big),
        Err(SpecError::TooLarge { .. })
    ));
}

#[test]
fn a_top_level_typo_is_closest_to_its_field() {
    let e = JobSpec::parse("nmae = \"a\"\nkind = \"train\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown field \"nmae\" at line 1 (did you mean \"name\"?)"
    );
    let e = JobSpec::parse("name = \"a\"\nkind = \"train\"\nzzzzzz = 1\n").unwrap_err();
    assert_eq!(e.to_string(), "unknown field \"zzzzzz\" at line 3");
}

#[test]
fn priority_and_preemptible_are_read_by_their_rules() {
    let base = "name = \"a\"\nkind = \"train\"\n";
    let spec =
        JobSpec::parse(&format!("{base}priority = \"high\"\npreemptible = false\n")).unwrap();
    assert_eq!((spec.priority, spec.preemptible), (priority::HIGH, false));
    let spec = JobSpec::parse(&format!("{base}priority = 42\n")).unwrap();
    assert_eq!(spec.priority, 42);
    assert_eq!(
        err(&format!("{base}priority = 1.5\n")),
        "priority: expected \"low\", \"normal\", \"high\" or an integer 0 to 1000, got \"\" at line 3"
    );
    assert_eq!(
        err(&format!("{base}priority = 1001\n")),
        "priority: expected \"low\", \"normal\", \"high\" or an integer 0 to 1000, got \"1001\" at line 3"
    );
    assert_eq!(
        err(&format!("{base}preemptible = \"no\"\n")),
        "preemptible: expected true or false at line 3"
    );
}

/// Each value is read in the parse's order, not the text's: a bad value above a missing
/// `name` or `kind` is named after them, and `workers` before `env` wherever they are.
#[test]
fn values_are_named_in_the_parses_order_not_the_texts() {
    assert_eq!(err("workers = 0\nkind = \"train\"\n"), "name: required");
    assert_eq!(
        err("workers = 0\nname = \"a\"\n"),
        "kind: required (one of train, search, command)"
    );
    assert_eq!(
        err("name = \"a\"\nenv = { A = 1 }\nkind = \"train\"\nworkers = 0\n"),
        "workers: expected a positive integer at line 4"
    );
    assert_eq!(
        err("name = \"a\"\nkind = \"train\"\nenv = { B = 1, A = 2 }\n"),
        "env.B: expected a string at line 3"
    );
}
