//! The serialized form of the replicated control state, pinned: a log entry of every command
//! and a snapshot of a state built from them, as bytes of the node's wire codec (JSON, the
//! codec of the Raft log, its snapshots and the control RPCs) committed under
//! `tests/fixtures/control_format/`. Old logs and snapshots on users' disks must keep loading,
//! so these bytes must keep decoding to the same values, and encoding those values must give
//! the same bytes.
//!
//! The fixture was written before the state machine was refactored (issue 26). Write it again
//! only for a deliberate format change: `RINGLEADER_WRITE_FIXTURES=1 cargo test --test
//! control_format` (and say why in the commit).

use std::path::PathBuf;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use ringleader::cluster::wire::{decode_json, encode_json};
use ringleader::control::store::TypeConfig;
use ringleader::domain::spec::JobSpec;
use ringleader::domain::state::datasets::DatasetRecord;
use ringleader::domain::state::Slot;
use ringleader::domain::{ops, ControlCommand, ControlResponse, ControlState, JobId, Op};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/control_format")
        .join(name)
}

fn spec(text: &str) -> Box<JobSpec> {
    Box::new(JobSpec::parse(text).unwrap())
}

fn slot(member: u32, rank: u32, gpus: Vec<u32>) -> Slot {
    Slot {
        member: format!("id-{member}"),
        name: format!("m{member}"),
        rank,
        local_rank: 0,
        worker: rank,
        gpus,
    }
}

fn secret(c: char) -> String {
    c.to_string().repeat(64)
}

const SEARCH: &str = r#"
name = "s"
kind = "search"
[train]
epochs = 9
[search]
algorithm = "asha"
trials = 4
metric = "val_accuracy"
direction = "max"
[[search.params]]
name = "train.lr"
type = "double"
min = 0.01
max = 0.5
"#;

/// One command of every kind, in an order that takes the state through each (log index i + 1).
fn commands() -> Vec<ControlCommand> {
    let j = JobId::from_log_index;
    let mut params = trainer::search::Params::new();
    params.insert("train.lr".into(), toml::Value::Float(0.125));
    vec![
        // 1: j-1, a command job of two workers.
        ControlCommand { op: Op::Submit(ops::Submit { spec: spec("name = \"a\"\nkind = \"command\"\nworkers = 2\nmax_restarts = 1\ncommand = [\"true\"]\n"), token: Some("tok-1".into()), owner: ringleader::domain::state::users::admin_user() }), at_ms: 1_000 },
        // 2: j-2, an elastic command job.
        ControlCommand { op: Op::Submit(ops::Submit { spec: spec("name = \"b\"\nkind = \"command\"\nworkers = 2\nmin_workers = 1\ncommand = [\"sleep\", \"9\"]\n[env]\nX = \"1\"\n"), token: None, owner: ringleader::domain::state::users::admin_user() }), at_ms: 1_001 },
        // 3: j-3, a search.
        ControlCommand { op: Op::Submit(ops::Submit { spec: spec(SEARCH), token: None, owner: ringleader::domain::state::users::admin_user() }), at_ms: 1_002 },
        ControlCommand { op: Op::Place(ops::Place { id: j(1), generation: 1, slots: vec![slot(0, 0, vec![0]), slot(1, 1, vec![])], secret: secret('a') }), at_ms: 1_010 },
        ControlCommand { op: Op::Unplaceable(ops::Unplaceable { id: j(2), reason: "no member has 1 free cpu".into(), quiet: false }), at_ms: 1_011 },
        ControlCommand { op: Op::Place(ops::Place { id: j(2), generation: 1, slots: vec![slot(2, 0, vec![]), slot(3, 1, vec![])], secret: secret('b') }), at_ms: 1_012 },
        ControlCommand { op: Op::Metric(ops::Metric { id: j(1), generation: 1, name: "loss".into(), value: 0.5, step: Some(3) }), at_ms: 1_020 },
        ControlCommand { op: Op::RankStats(ops::RankStats { id: j(2), generation: 1, rank: 0, step: 10, compute_ms: 12.5, wait_ms: 0.25 }), at_ms: 1_021 },
        ControlCommand { op: Op::RankLost(ops::RankLost { id: j(2), generation: 1, rank: 1, hung: true, reason: "stopped".into() }), at_ms: 1_022 },
        // 10
        ControlCommand { op: Op::Reform(ops::Reform { id: j(2), generation: 2, slots: vec![slot(2, 0, vec![])], secret: secret('c'), reason: "hung m3 (rank 1)".into() }), at_ms: 1_023 },
        ControlCommand { op: Op::WorkerNote(ops::WorkerNote { id: j(2), generation: 2, rank: 0, message: "dataset digits fetched".into(), cannot_start: true }), at_ms: 1_024 },
        ControlCommand { op: Op::WorkerExited(ops::WorkerExited { id: j(1), generation: 1, rank: 0, code: 0, end: None }), at_ms: 1_030 },
        ControlCommand { op: Op::AttemptFailed(ops::AttemptFailed { id: j(1), generation: 1, reason: "peer-lost m1 (rank 1)".into() }), at_ms: 1_031 },
        ControlCommand { op: Op::Blacklist(ops::Blacklist { member: "id-3".into(), name: "m3".into(), cooldown_ms: 60_000, reason: "straggler".into() }), at_ms: 1_032 },
        // 15: j-15, trial 0 of the search.
        ControlCommand { op: Op::TrialStart(ops::TrialStart { search: j(3), trial: 0, params, bracket: 0, target: 1, slots: vec![slot(4, 0, vec![])], secret: secret('d') }), at_ms: 1_040 },
        ControlCommand { op: Op::TrialReport(ops::TrialReport { id: j(15), generation: 1, resource: 1, value: 0.75 }), at_ms: 1_041 },
        ControlCommand { op: Op::TrialPromote(ops::TrialPromote { search: j(3), trial: 0, target: 3, slots: vec![slot(5, 0, vec![])], secret: secret('e') }), at_ms: 1_042 },
        ControlCommand { op: Op::TrialCopy(ops::TrialCopy { search: j(3), trial: 0, slots: vec![slot(6, 0, vec![])], secret: secret('f') }), at_ms: 1_043 },
        ControlCommand { op: Op::Cancel(ops::Cancel { id: j(2) }), at_ms: 1_050 },
        // 20
        ControlCommand { op: Op::DatasetAdd(ops::DatasetAdd { name: "mnist-small".into(), record: DatasetRecord {
                root: "ab".repeat(32).parse().unwrap(),
                size_bytes: 1_797 * 65,
                files: 2,
                chunks: 2,
                added_at_ms: 1_060,
                added_on: "m0".into(),
                owner: "admin".into(),
            } }), at_ms: 1_060 },
        ControlCommand { op: Op::DatasetAdd(ops::DatasetAdd { name: "old".into(), record: DatasetRecord {
                root: "cd".repeat(32).parse().unwrap(),
                size_bytes: 10,
                files: 1,
                chunks: 1,
                added_at_ms: 1_061,
                added_on: "m1".into(),
                owner: "admin".into(),
            } }), at_ms: 1_061 },
        ControlCommand { op: Op::DatasetRemove(ops::DatasetRemove { name: "old".into() }), at_ms: 1_062 },
        ControlCommand { op: Op::TokenCreate(ops::TokenCreate { name: "ci".into(), hash: "01".repeat(32), created_by: "admin@m0".into(), user: None, role: Default::default() }), at_ms: 1_070 },
        ControlCommand { op: Op::TokenCreate(ops::TokenCreate { name: "old".into(), hash: "02".repeat(32), created_by: "admin@m1".into(), user: None, role: Default::default() }), at_ms: 1_071 },
        // 25
        ControlCommand { op: Op::TokenRevoke(ops::TokenRevoke { name: "old".into() }), at_ms: 1_072 },
        ControlCommand { op: Op::MemberRemove(ops::MemberRemove { peer_id: "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA".into(), name: "m7".into() }), at_ms: 1_080 },
        ControlCommand { op: Op::SearchFinished(ops::SearchFinished { search: j(3) }), at_ms: 1_090 },
        ControlCommand { op: Op::Compact(ops::Compact { ids: vec![j(2)] }), at_ms: 1_100 },
        // 29: j-29, an elastic command job of the ringleader protocol, with a standby joiner
        // (added with the standby, after the fixture above was pinned).
        ControlCommand { op: Op::Submit(ops::Submit { spec: spec("name = \"p\"\nkind = \"command\"\nworkers = 1\nmax_workers = 2\ncommand = [\"true\"]\n[elastic]\nprotocol = \"ringleader\"\n"), token: None, owner: ringleader::domain::state::users::admin_user() }), at_ms: 1_110 },
        // 30
        ControlCommand { op: Op::Place(ops::Place { id: j(29), generation: 1, slots: vec![slot(8, 0, vec![])], secret: secret('9') }), at_ms: 1_111 },
        ControlCommand { op: Op::Standby(ops::Standby { id: j(29), generation: 1, slot: Slot { worker: 1, ..slot(9, 1, vec![]) } }), at_ms: 1_112 },
        ControlCommand { op: Op::StandbyDropped(ops::StandbyDropped { id: j(29), worker: 9, reason: "its process exited with code 1".into() }), at_ms: 1_113 },
        ControlCommand { op: Op::StandbyReady(ops::StandbyReady { id: j(29), worker: 1 }), at_ms: 1_114 },
    ]
}

fn entry(index: u64, cmd: ControlCommand) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(2, 7), index),
        payload: EntryPayload::Normal(cmd),
    }
}

/// The state the commands build, and what applying each answered.
fn state() -> (ControlState, Vec<ControlResponse>) {
    let mut state = ControlState::default();
    let mut responses = Vec::new();
    for (i, cmd) in commands().into_iter().enumerate() {
        responses.push(state.apply(i as u64 + 1, &cmd));
    }
    (state, responses)
}

fn encoded_entries() -> Vec<u8> {
    let mut out = Vec::new();
    for (i, cmd) in commands().into_iter().enumerate() {
        out.extend(encode_json(&entry(i as u64 + 1, cmd)).unwrap());
        out.push(b'\n');
    }
    out
}

#[test]
fn every_command_kind_is_in_the_fixture() {
    let kinds: std::collections::BTreeSet<String> = commands()
        .iter()
        .map(|c| {
            serde_json::to_value(c).unwrap()["op"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kinds.len(), 26, "{kinds:?}");
}

#[test]
fn log_entries_keep_their_format() {
    let path = fixture("log_entries.jsonl");
    if std::env::var_os("RINGLEADER_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, encoded_entries()).unwrap();
    }
    let pinned = std::fs::read(&path).unwrap();
    let lines: Vec<&[u8]> = pinned
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let commands = commands();
    assert_eq!(lines.len(), commands.len());
    for (i, (line, cmd)) in lines.iter().zip(commands).enumerate() {
        let decoded: Entry<TypeConfig> = decode_json(line).unwrap();
        assert_eq!(decoded.log_id, entry(i as u64 + 1, cmd.clone()).log_id);
        let EntryPayload::Normal(got) = &decoded.payload else {
            panic!("entry {i}: {:?}", decoded.payload)
        };
        assert_eq!(*got, cmd, "entry {} decodes to its command", i + 1);
        assert_eq!(
            encode_json(&decoded).unwrap(),
            line.to_vec(),
            "entry {} encodes to the same bytes",
            i + 1
        );
    }
}

#[test]
fn a_snapshot_keeps_its_format() {
    let path = fixture("snapshot.json");
    let (state, responses) = state();
    let answers = fixture("responses.json");
    if std::env::var_os("RINGLEADER_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, encode_json(&state).unwrap()).unwrap();
        std::fs::write(&answers, serde_json::to_vec_pretty(&responses).unwrap()).unwrap();
    }
    // Applying the log answers as it did when the fixture was written.
    let pinned: Vec<ControlResponse> =
        serde_json::from_slice(&std::fs::read(&answers).unwrap()).unwrap();
    assert_eq!(responses, pinned);
    let pinned = std::fs::read(&path).unwrap();
    let decoded: ControlState = decode_json(&pinned).unwrap();
    assert_eq!(
        decoded, state,
        "the snapshot decodes to the state the log builds"
    );
    assert_eq!(encode_json(&decoded).unwrap(), pinned);
    // A snapshot written before jobs kept their failures' causes (2026-12-06) still loads:
    // the same state less what the field adds.
    let older: ControlState =
        decode_json(&std::fs::read(fixture("snapshot-2026-12-06.json")).unwrap()).unwrap();
    let mut without = state.clone();
    without.jobs.values_mut().for_each(|j| j.failures.clear());
    assert_eq!(older, without, "the 2026-12-06 snapshot decodes");
    // The state is not trivial: every part of it holds something.
    assert_eq!(decoded.applied_index, commands().len() as u64);
    assert!(decoded.jobs.len() >= 3 && !decoded.tokens.is_empty());
    assert!(!decoded.blacklist.is_empty() && !decoded.datasets.is_empty());
    assert!(!decoded.api_tokens.is_empty() && !decoded.removed.is_empty());
}
